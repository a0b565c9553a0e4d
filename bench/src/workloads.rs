//! The operations the suite times, as [`Workload`]s shared by the ratio
//! table and the criterion benches. Every put writes fresh content (a
//! stamped [`Payload`]); every read checks its length.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use store_core::{Digest, Key, Store};

use crate::data::{unique_body, Payload, KIB, MIB};
use crate::fixtures::{err, ns, wipe_files, BenchResult};
use crate::measure::{op, Workload};
use crate::peer::Cacache;
use crate::raw::{self, fresh_key, RawFs, RawPg, RawSqlite};

/// Bytes of the ranged read.
pub const RANGE_LEN: usize = 4 * KIB;
/// The blob the ranged read is taken from.
pub const RANGE_BLOB: usize = 64 * MIB;

/// `n` puts of fresh `size`-byte content into a local-engine root, whose
/// content files are removed between batches (untimed).
pub fn local_put_op(store: Store, size: usize, root: &Path) -> impl Workload {
    let ns_dir = root.join(ns().as_str());
    op(put_fn(store, size, None)).with_reset(async move || wipe_files(&ns_dir))
}

/// `n` puts of fresh `size`-byte content. The store keeps what they wrote.
pub fn put_op(store: Store, size: usize) -> impl Workload {
    op(put_fn(store, size, None))
}

/// `n` puts of fresh `size`-byte content; the entries are deleted through
/// the store between batches (untimed), so the store does not grow.
pub fn churn_put_op(store: Store, size: usize) -> impl Workload {
    let keys: Rc<RefCell<Vec<Key>>> = Rc::default();
    let written = keys.clone();
    op(put_fn(store.clone(), size, Some(written))).with_reset(async move || {
        let doomed = std::mem::take(&mut *keys.borrow_mut());
        for k in doomed {
            store.delete(&k).await.expect("delete");
        }
    })
}

fn put_fn(
    store: Store,
    size: usize,
    record: Option<Rc<RefCell<Vec<Key>>>>,
) -> impl AsyncFnMut(u64) {
    let mut p = Payload::new(size);
    let ns = ns();
    async move |n: u64| {
        for _ in 0..n {
            let len = p.len() as u64;
            let r = store
                .put_opts(
                    &ns,
                    p.fresh(),
                    store_core::PutOptions {
                        len: Some(len),
                        ..Default::default()
                    },
                )
                .await
                .expect("put");
            assert!(!r.deduplicated, "bench puts must be fresh");
            if let Some(keys) = &record {
                keys.borrow_mut().push(r.key().clone());
            }
        }
    }
}

/// Puts of fresh `size`-byte bodies the caller already owns as `Bytes`
/// (`Store::put_bytes`): at most [`OWNED_BATCH`] per timed batch, their
/// bodies made (copied from a stamped payload) and the previous batch's
/// entries deleted in the untimed reset. Making a body is the caller's
/// cost, not the store's, so it is not timed.
pub fn owned_put_op(store: Store, size: usize) -> impl Workload {
    OwnedPut {
        store,
        payload: Payload::new(size),
        bodies: Vec::new(),
        written: Vec::new(),
    }
}

/// Most puts of one [`owned_put_op`] batch (each body is prepared ahead).
pub const OWNED_BATCH: u64 = 4;

struct OwnedPut {
    store: Store,
    payload: Payload,
    bodies: Vec<bytes::Bytes>,
    written: Vec<Key>,
}

impl Workload for OwnedPut {
    fn run(&mut self, n: u64) -> crate::measure::LocalFut<'_> {
        Box::pin(async move {
            let ns = ns();
            for body in self.bodies.drain(..n as usize) {
                let r = self.store.put_bytes(&ns, body).await.expect("put");
                assert!(!r.deduplicated, "bench puts must be fresh");
                self.written.push(r.key().clone());
            }
        })
    }

    fn reset(&mut self) -> crate::measure::LocalFut<'_> {
        Box::pin(async move {
            for k in self.written.drain(..) {
                self.store.delete(&k).await.expect("delete");
            }
            self.bodies.clear();
            for _ in 0..OWNED_BATCH {
                let body = bytes::Bytes::copy_from_slice(self.payload.fresh());
                self.bodies.push(body);
            }
        })
    }

    fn max_batch(&self) -> u64 {
        OWNED_BATCH
    }
}

/// Puts one fresh `size`-byte entry and returns its key.
pub async fn put_one(store: &Store, size: usize) -> BenchResult<Key> {
    let body = unique_body(size);
    let r = store
        .put_opts(
            &ns(),
            &body[..],
            store_core::PutOptions {
                len: Some(size as u64),
                ..Default::default()
            },
        )
        .await
        .map_err(err)?;
    Ok(r.key().clone())
}

/// `n` verified gets of `key`, read whole into memory.
pub fn get_op(store: Store, key: Key, size: usize) -> impl Workload {
    op(async move |n: u64| {
        for _ in 0..n {
            let blob = store.get(&key).await.expect("get").expect("present");
            let bytes = blob.bytes().await.expect("verified read");
            assert_eq!(bytes.len(), size);
        }
    })
}

/// `n` 4 KiB `read_range`s at spread-out offsets of a 64 MiB entry.
pub fn range_op(store: Store, key: Key) -> impl Workload {
    let mut i = 0u64;
    op(async move |n: u64| {
        for _ in 0..n {
            let start = range_offset(i);
            i += 1;
            let blob = store
                .read_range(&key, start..start + RANGE_LEN as u64)
                .await
                .expect("read_range");
            let bytes = blob.bytes().await.expect("range read");
            assert_eq!(bytes.len(), RANGE_LEN);
        }
    })
}

/// Spread-out 4 KiB-aligned offsets inside the 64 MiB blob.
pub fn range_offset(i: u64) -> u64 {
    let slots = (RANGE_BLOB / RANGE_LEN) as u64;
    ((i * 7919) % slots) * RANGE_LEN as u64
}

/// `n` digest + outboard computations of `size` bytes in 256 KiB updates,
/// as the put pipeline does them (ADR-032).
pub fn outboard_op(size: usize) -> impl Workload {
    let p = Payload::new(size);
    op(async move |n: u64| {
        for _ in 0..n {
            let mut b = store_types::outboard::OutboardBuilder::new();
            for part in p.current().chunks(store_types::CHUNK_SIZE) {
                b.update(part);
            }
            std::hint::black_box(b.finalize());
        }
    })
}

/// `n` BLAKE3 hashes of `size` bytes (the hashing limit).
pub fn blake3_op(size: usize) -> impl Workload {
    let p = Payload::new(size);
    op(async move |n: u64| {
        for _ in 0..n {
            std::hint::black_box(raw::blake3(std::hint::black_box(p.current())));
        }
    })
}

/// `n` fresh puts of `size` bytes spread over `putters` tasks (at least
/// 8 per task per timed batch).
pub fn concurrent_put_op(store: Store, size: usize, putters: u64) -> impl Workload {
    op(async move |n: u64| {
        let mut tasks = Vec::with_capacity(putters as usize);
        for t in 0..putters {
            let count = n / putters + u64::from(t < n % putters);
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let ns = ns();
                for _ in 0..count {
                    let body = unique_body(size);
                    store
                        .put_opts(
                            &ns,
                            &body[..],
                            store_core::PutOptions {
                                len: Some(size as u64),
                                ..Default::default()
                            },
                        )
                        .await
                        .expect("put");
                }
            }));
        }
        for t in tasks {
            t.await.expect("putter");
        }
    })
    .with_min_batch(putters * 8)
}

/// `n` `has_many` calls over `digests`, of which `present` exist.
pub fn has_many_op(store: Store, digests: Vec<Digest>, present: usize) -> impl Workload {
    let ns = ns();
    op(async move |n: u64| {
        for _ in 0..n {
            let found = store.has_many(&ns, &digests).await.expect("has_many");
            assert_eq!(found.iter().filter(|b| **b).count(), present);
        }
    })
}

/// `present` stored digests (1 KiB entries) interleaved with as many absent
/// ones.
pub async fn has_many_set(store: &Store, present: usize) -> BenchResult<Vec<Digest>> {
    let mut out = Vec::with_capacity(present * 2);
    for _ in 0..present {
        out.push(put_one(store, KIB).await?.digest);
        out.push(Digest::from_bytes(fresh_key()));
    }
    Ok(out)
}

/// `n` cacache `write_hash`es of fresh content; the cache's files are
/// removed between batches.
pub fn cacache_put_op(c: &Cacache, size: usize) -> impl Workload + '_ {
    let mut p = Payload::new(size);
    let dir = c.dir().to_path_buf();
    op(async move |n: u64| {
        for _ in 0..n {
            c.put(p.fresh()).await.expect("cacache put");
        }
    })
    .with_reset(async move || wipe_files(&dir))
}

/// `n` verified cacache `read_hash`es of one entry.
pub async fn cacache_get_op(c: &Cacache, size: usize) -> BenchResult<impl Workload + '_> {
    let sri = c.put(&unique_body(size)).await?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = c.get(&sri).await.expect("cacache get");
            assert_eq!(v.len(), size);
        }
    }))
}

/// `n` cacache `write_hash_sync`es of fresh content on the bench's thread;
/// the cache's files are removed between batches.
pub fn cacache_put_sync_op(c: &Cacache, size: usize) -> impl Workload + '_ {
    let mut p = Payload::new(size);
    let dir = c.dir().to_path_buf();
    op(async move |n: u64| {
        for _ in 0..n {
            c.put_sync(p.fresh()).expect("cacache put");
        }
    })
    .with_reset(async move || wipe_files(&dir))
}

/// `n` verified cacache `read_hash_sync`s of one entry on the bench's
/// thread.
pub async fn cacache_get_sync_op(c: &Cacache, size: usize) -> BenchResult<impl Workload + '_> {
    let sri = c.put(&unique_body(size)).await?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = c.get_sync(&sri).expect("cacache get");
            assert_eq!(v.len(), size);
        }
    }))
}

/// iroh-blobs' fastest put path: `n` fresh bodies handed over without a
/// copy into one `Batch` (`add_bytes` under temporary tags, no tag rows),
/// then one `sync_db`, so the batch pays for the metadata commit its puts
/// queued (a put returns before it). One store for the whole run; between
/// batches (untimed) the reset waits until the store's own collector has
/// deleted the last batch's blobs, as the other put rows delete theirs.
#[cfg(feature = "iroh")]
pub async fn iroh_put_op(root: &Path, size: usize) -> BenchResult<impl Workload> {
    use crate::measure::LocalFut;
    struct IrohPut {
        peer: crate::peer::IrohBlobs,
        payload: crate::data::BytesPayload,
        last: Vec<iroh_blobs::Hash>,
    }
    impl Workload for IrohPut {
        fn run(&mut self, n: u64) -> LocalFut<'_> {
            Box::pin(async move {
                let payload = &mut self.payload;
                let bodies = (0..n).map(|_| payload.fresh());
                self.last = self
                    .peer
                    .put_batch(bodies)
                    .await
                    .expect("iroh-blobs batch put");
            })
        }

        fn reset(&mut self) -> LocalFut<'_> {
            Box::pin(async move {
                let gone = self
                    .peer
                    .wait_collected(&self.last, IROH_COLLECT_LIMIT)
                    .await
                    .expect("iroh-blobs has");
                assert!(
                    gone,
                    "iroh-blobs' collector left the last batch's blobs for {IROH_COLLECT_LIMIT:?}"
                );
            })
        }
    }
    Ok(IrohPut {
        peer: crate::peer::IrohBlobs::open_collected(root, IROH_GC_INTERVAL).await?,
        payload: crate::data::BytesPayload::new(size),
        last: Vec::new(),
    })
}

/// How often the put rows' iroh-blobs store runs its own collector.
#[cfg(feature = "iroh")]
const IROH_GC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a reset waits for that collector to empty the store.
#[cfg(feature = "iroh")]
const IROH_COLLECT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `n` verified iroh-blobs reads (`get_bytes`) of one blob.
#[cfg(feature = "iroh")]
pub async fn iroh_get_op(root: &Path, size: usize) -> BenchResult<impl Workload> {
    let peer = crate::peer::IrohBlobs::open(root).await?;
    let hash = peer.put(unique_body(size).into()).await?;
    peer.sync().await?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = peer.get(hash).await.expect("iroh-blobs get");
            assert_eq!(v.len(), size);
        }
    }))
}

/// `n` raw write (+ fsync) + rename of fresh names; the files are removed
/// between batches.
pub fn fs_put_op(fs: &RawFs, size: usize, fsync: bool) -> impl Workload + '_ {
    let mut p = Payload::new(size);
    let dir = fs.dir().to_path_buf();
    op(async move |n: u64| {
        for _ in 0..n {
            fs.put(p.fresh(), fsync).expect("raw put");
        }
    })
    .with_reset(async move || wipe_files(&dir))
}

/// `n` raw reads of one file.
pub fn fs_get_op(fs: &RawFs, size: usize) -> BenchResult<impl Workload> {
    let path = fs.put(&unique_body(size), false).map_err(err)?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = RawFs::get(&path).expect("raw read");
            assert_eq!(v.len(), size);
        }
    }))
}

/// `n` raw rusqlite inserts, one transaction each.
pub fn sqlite_put_op(db: &RawSqlite, size: usize) -> impl Workload + '_ {
    let mut p = Payload::new(size);
    op(async move |n: u64| {
        for _ in 0..n {
            db.insert("bench", &fresh_key(), p.fresh())
                .expect("raw insert");
        }
    })
}

/// `n` raw rusqlite point selects of one row.
pub fn sqlite_get_op(db: &RawSqlite, size: usize) -> BenchResult<impl Workload + '_> {
    let key = fresh_key();
    db.insert("bench", &key, &unique_body(size))?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = db.select("bench", &key).expect("raw select");
            assert_eq!(v.len(), size);
        }
    }))
}

/// `n` raw bytea inserts, one transaction each.
pub fn pg_put_op<'a>(pg: &'a RawPg<'a>, size: usize) -> impl Workload + 'a {
    let mut p = Payload::new(size);
    op(async move |n: u64| {
        for _ in 0..n {
            pg.insert("bench", &fresh_key(), p.fresh())
                .await
                .expect("raw insert");
        }
    })
}

/// `n` raw bytea point selects of one row.
pub async fn pg_get_op<'a>(pg: &'a RawPg<'a>, size: usize) -> BenchResult<impl Workload + 'a> {
    let key = fresh_key();
    pg.insert("bench", &key, &unique_body(size)).await?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = pg.select("bench", &key).await.expect("raw select");
            assert_eq!(v.len(), size);
        }
    }))
}

/// `n` `lo_from_bytea` calls.
pub fn lo_put_op<'a>(pg: &'a RawPg<'a>, size: usize) -> impl Workload + 'a {
    let mut p = Payload::new(size);
    op(async move |n: u64| {
        for _ in 0..n {
            pg.lo_put(p.fresh()).await.expect("lo_from_bytea");
        }
    })
}

/// `n` whole-object `lo_get`s of one large object.
pub async fn lo_get_op<'a>(pg: &'a RawPg<'a>, size: usize) -> BenchResult<impl Workload + 'a> {
    let oid = pg.lo_put(&unique_body(size)).await?;
    Ok(op(async move |n: u64| {
        for _ in 0..n {
            let v = pg.lo_get(oid).await.expect("lo_get");
            assert_eq!(v.len(), size);
        }
    }))
}
