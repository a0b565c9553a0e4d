//! Working-set reads (issue 33): a population of `n` entries of mixed sizes
//! — far more than any Blobpool cache holds — written once into Blobpool's
//! default composite, Blobpool's local engine, cacache and iroh-blobs, then
//! read back with keys drawn uniformly or by a Zipf law, with the page cache
//! warm (every file of every store read once) or dropped (every file of
//! every store evicted with `posix_fadvise(DONTNEED)`: this VM does not let
//! root write `/proc/sys/vm/drop_caches`).
//!
//! The population lives in a directory that survives runs
//! (`bench-skeptic populate`), with a manifest naming every entry's class,
//! BLAKE3 digest (Blobpool's key and iroh-blobs' hash) and cacache
//! integrity, so three separate runs read the very same stores.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;
use store_core::{Digest, Key, Store};

use crate::data::{fill_random, size_name, KIB};
use crate::fixtures::{self, err, ns, BenchResult};
use crate::measure::{op, Workload};
use crate::peer::{Cacache, Integrity};

/// Entries of a full population.
pub const ENTRIES: usize = 1_000_000;

/// The size classes and their share of entries, in percent: most entries
/// small, 2 % at 64 KiB (1.3 GiB of a million-entry set per
/// store, 100× the largest Blobpool cache).
pub const CLASSES: [(usize, u64); 3] = [(KIB, 88), (4 * KIB, 10), (64 * KIB, 2)];

/// The classes the read rows measure.
pub const READ_CLASSES: [usize; 2] = [KIB, 64 * KIB];

/// The Zipf exponent (YCSB's).
pub const ZIPF_S: f64 = 0.99;

/// The class of entry `i` (a fixed interleaving, so any prefix of the
/// population has the same mix).
pub fn class_of(i: usize) -> usize {
    let slot = (i as u64 * 37) % 100;
    let mut acc = 0;
    for (size, pct) in CLASSES {
        acc += pct;
        if slot < acc {
            return size;
        }
    }
    unreachable!("shares sum to 100")
}

/// The body of entry `i`: pseudo-random bytes seeded by `i` and the
/// process's salt (the population is written by one process).
pub fn body_of(i: usize) -> Bytes {
    let mut v = vec![0u8; class_of(i)];
    fill_random(&mut v, i as u64);
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    Bytes::from(v)
}

/// Where each store of a population lives.
pub struct Layout {
    /// The population's directory.
    pub root: PathBuf,
}

impl Layout {
    /// The default composite (SQLite up to 64 KiB, local files above).
    pub fn composite(&self) -> PathBuf {
        self.root.join("bp-default")
    }
    /// The local engine (every entry a file).
    pub fn local(&self) -> PathBuf {
        self.root.join("bp-local")
    }
    /// cacache's directory.
    pub fn cacache(&self) -> PathBuf {
        self.root.join("cacache")
    }
    /// iroh-blobs' `FsStore` root (the store itself is `iroh/0`).
    pub fn iroh(&self) -> PathBuf {
        self.root.join("iroh")
    }
    /// The manifest: one line per entry, `size digest-hex integrity`.
    pub fn manifest(&self) -> PathBuf {
        self.root.join("manifest.txt")
    }
}

/// One entry of the manifest.
#[derive(Clone)]
pub struct Entry {
    /// Its size.
    pub size: usize,
    /// BLAKE3 digest: Blobpool's key, iroh-blobs' hash.
    pub digest: Digest,
    /// cacache's key.
    pub sri: Integrity,
}

/// Writes `n` entries into the four stores under `layout.root` (which must
/// not hold a population yet) with `concurrency` writers, then the
/// manifest. Blobpool's stores are opened at the peers' durability for the
/// fill (SQLite `synchronous=NORMAL`, files not fsynced): the layout on
/// disk is the same, and the reads do not depend on how it got there.
pub async fn populate(layout: &Layout, n: usize, concurrency: usize) -> BenchResult<()> {
    if layout.manifest().exists() {
        return Err(format!(
            "{} already holds a population",
            layout.root.display()
        ));
    }
    std::fs::create_dir_all(&layout.root).map_err(err)?;
    let composite = fixtures::composite_store_unsynced(&layout.composite()).await?;
    let local = fixtures::local_store(&layout.local(), false).await?;
    let cacache = Arc::new(Cacache::new(layout.cacache()));
    let iroh = Arc::new(crate::peer::IrohBlobs::open(layout.iroh()).await?);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (composite, local, cacache, iroh, next) = (
            composite.clone(),
            local.clone(),
            cacache.clone(),
            iroh.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, String>(out);
                }
                let body = body_of(i);
                let a = composite
                    .put_bytes(&ns(), body.clone())
                    .await
                    .map_err(err)?;
                let b = local.put_bytes(&ns(), body.clone()).await.map_err(err)?;
                if a.key() != b.key() {
                    return Err(format!("entry {i}: the two Blobpool stores disagree"));
                }
                let sri = cacache.put(&body).await?;
                let hash = iroh.put(body.clone()).await?;
                if hash.as_bytes() != a.key().digest.as_bytes() {
                    return Err(format!(
                        "entry {i}: iroh-blobs' hash is not the BLAKE3 digest"
                    ));
                }
                out.push((i, a.key().digest, sri));
                if i % 50_000 == 0 {
                    eprintln!("populate: {i} of {n}");
                }
            }
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.map_err(err)??);
    }
    all.sort_by_key(|(i, _, _)| *i);
    iroh.sync().await?;
    let tmp = layout.root.join("manifest.tmp");
    let mut w = BufWriter::new(File::create(&tmp).map_err(err)?);
    for (i, digest, sri) in &all {
        writeln!(w, "{} {} {}", class_of(*i), digest, sri).map_err(err)?;
    }
    w.into_inner().map_err(err)?.sync_all().map_err(err)?;
    std::fs::rename(&tmp, layout.manifest()).map_err(err)
}

/// Reads the manifest.
pub fn load_manifest(layout: &Layout) -> BenchResult<Vec<Entry>> {
    let f = File::open(layout.manifest()).map_err(|e| {
        format!(
            "{}: {e} (run `bench-skeptic populate` first)",
            layout.manifest().display()
        )
    })?;
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line.map_err(err)?;
        let mut parts = line.split(' ');
        let (Some(size), Some(digest), Some(sri)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("bad manifest line {line:?}"));
        };
        out.push(Entry {
            size: size.parse().map_err(err)?,
            digest: Digest::from_str(digest).map_err(err)?,
            sri: sri.parse().map_err(err)?,
        });
    }
    Ok(out)
}

/// How keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Every entry of the class equally likely.
    Uniform,
    /// Zipf with exponent [`ZIPF_S`] over a fixed random permutation of
    /// the class (the hot entries are scattered over the store).
    Zipf,
}

impl Keys {
    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Keys::Uniform => "uniform",
            Keys::Zipf => "Zipf 0.99",
        }
    }
}

/// An endless, seeded sequence of indices into one class's entries; two
/// samplers with the same seed yield the same sequence (so every store in
/// a group reads the same keys).
pub struct Sampler {
    rng: rand::rngs::StdRng,
    n: usize,
    zipf: Option<(rand_distr::Zipf<f64>, Arc<Vec<u32>>)>,
}

impl Sampler {
    /// Over `n` entries; `perm` is the Zipf ranks' permutation.
    pub fn new(keys: Keys, n: usize, seed: u64, perm: Arc<Vec<u32>>) -> Self {
        let zipf = match keys {
            Keys::Uniform => None,
            Keys::Zipf => Some((
                rand_distr::Zipf::new(n as f64, ZIPF_S).expect("valid Zipf"),
                perm,
            )),
        };
        Sampler {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            n,
            zipf,
        }
    }

    /// The next index.
    pub fn next_index(&mut self) -> usize {
        match &self.zipf {
            None => self.rng.random_range(0..self.n),
            Some((z, perm)) => {
                let rank = z.sample(&mut self.rng) as usize; // 1..=n
                perm[rank.clamp(1, self.n) - 1] as usize
            }
        }
    }
}

/// A seeded random permutation of `0..n`.
pub fn permutation(n: usize, seed: u64) -> Vec<u32> {
    use rand::seq::SliceRandom;
    let mut v: Vec<u32> = (0..n as u32).collect();
    v.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    v
}

/// Every regular file under `dir`.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}

/// Threads that walk a store's files in [`drop_cache`] and [`warm_cache`]
/// (the virtual disk serves several requests at once).
const WALKERS: usize = 4;

/// Runs `f` on every file under `dir`, on [`WALKERS`] threads; returns the
/// files and the sum of `f`'s answers.
fn each_file(dir: &Path, f: impl Fn(&Path) -> u64 + Sync) -> (usize, u64) {
    let files = files_under(dir);
    let total = std::sync::atomic::AtomicU64::new(0);
    let per = files.len().div_ceil(WALKERS).max(1);
    std::thread::scope(|s| {
        for part in files.chunks(per) {
            let (f, total) = (&f, &total);
            s.spawn(move || {
                let sum: u64 = part.iter().map(|p| f(p)).sum();
                total.fetch_add(sum, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    (files.len(), total.into_inner())
}

/// Evicts every file under `dir` from the page cache
/// (`posix_fadvise(DONTNEED)`; the population's files are clean, which
/// DONTNEED needs). Returns the files touched.
pub fn drop_cache(dir: &Path) -> usize {
    each_file(dir, |p| {
        if let Ok(file) = File::open(p) {
            // SAFETY: a valid open descriptor; the call only advises the
            // kernel about that file's cached pages.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
        0
    })
    .0
}

/// Reads every file under `dir` once (into the page cache). Returns the
/// bytes read.
pub fn warm_cache(dir: &Path) -> u64 {
    each_file(dir, |p| {
        let mut n = 0;
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 256 * 1024]);
        }
        if let Ok(mut file) = File::open(p) {
            use std::io::Read;
            BUF.with_borrow_mut(|buf| {
                while let Ok(k) = file.read(buf) {
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                }
            });
        }
        n
    })
    .1
}

/// [`warm_cache`] of every directory at once (one walker group each), so
/// every store's pages have the same age when the reads begin.
pub fn warm_all(dirs: &[&PathBuf]) -> u64 {
    std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|d| s.spawn(move || warm_cache(d)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    })
}

/// The four stores, opened for reading.
pub struct Readers {
    /// The default composite, default durability.
    pub composite: Store,
    /// The local engine (fsync on).
    pub local: Store,
    /// cacache.
    pub cacache: Arc<Cacache>,
    /// iroh-blobs.
    pub iroh: Arc<crate::peer::IrohBlobs>,
}

impl Readers {
    /// Opens the population's stores.
    pub async fn open(layout: &Layout) -> BenchResult<Self> {
        Ok(Readers {
            composite: fixtures::composite_store(&layout.composite()).await?,
            local: fixtures::local_store(&layout.local(), true).await?,
            cacache: Arc::new(Cacache::new(layout.cacache())),
            iroh: Arc::new(crate::peer::IrohBlobs::open(layout.iroh()).await?),
        })
    }
}

/// The names of [`read_group`]'s workloads, in order.
pub const READERS: [&str; 4] = [
    "Blobpool sqlite+local (default)",
    "Blobpool local",
    "cacache (sync)",
    "iroh-blobs",
];

/// One class's entries and the sampler seed of a group.
pub struct ClassSet {
    /// The entries of the class.
    pub entries: Arc<Vec<Entry>>,
    /// The Zipf permutation.
    pub perm: Arc<Vec<u32>>,
}

impl ClassSet {
    /// The entries of `size` in `all`.
    pub fn of(all: &[Entry], size: usize, seed: u64) -> Self {
        let entries: Vec<Entry> = all.iter().filter(|e| e.size == size).cloned().collect();
        let perm = permutation(entries.len(), seed);
        ClassSet {
            entries: Arc::new(entries),
            perm: Arc::new(perm),
        }
    }
}

/// The four verified-get workloads of one class and key law, each drawing
/// the same key sequence (`seed`).
pub fn read_group(r: &Readers, set: &ClassSet, keys: Keys, seed: u64) -> Vec<Box<dyn Workload>> {
    let n = set.entries.len();
    let sampler = || Sampler::new(keys, n, seed, set.perm.clone());
    let mut out: Vec<Box<dyn Workload>> = Vec::new();
    for store in [r.composite.clone(), r.local.clone()] {
        let (entries, mut s) = (set.entries.clone(), sampler());
        out.push(Box::new(op(async move |k: u64| {
            for _ in 0..k {
                let e = &entries[s.next_index()];
                let key = Key::new(ns(), e.digest);
                let blob = store.get(&key).await.expect("get").expect("present");
                let bytes = blob.bytes().await.expect("verified read");
                assert_eq!(bytes.len(), e.size);
            }
        })));
    }
    let (entries, mut s, c) = (set.entries.clone(), sampler(), r.cacache.clone());
    out.push(Box::new(op(async move |k: u64| {
        for _ in 0..k {
            let e = &entries[s.next_index()];
            let bytes = c.get_sync(&e.sri).expect("cacache verified read");
            assert_eq!(bytes.len(), e.size);
        }
    })));
    let (entries, mut s, iroh) = (set.entries.clone(), sampler(), r.iroh.clone());
    out.push(Box::new(op(async move |k: u64| {
        for _ in 0..k {
            let e = &entries[s.next_index()];
            let hash = iroh_blobs::Hash::from_bytes(*e.digest.as_bytes());
            let bytes = iroh.get(hash).await.expect("iroh verified read");
            assert_eq!(bytes.len(), e.size);
        }
    })));
    out
}

/// A row label: `get 1 KiB (verified), uniform`.
pub fn label(size: usize, keys: Keys) -> String {
    format!("get {} (verified), {}", size_name(size), keys.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_mix_as_declared() {
        let mut counts = std::collections::BTreeMap::new();
        for i in 0..10_000 {
            *counts.entry(class_of(i)).or_insert(0u64) += 1;
        }
        for (size, pct) in CLASSES {
            assert_eq!(counts[&size], pct * 100, "{size}");
        }
    }

    #[test]
    fn samplers_with_one_seed_agree_and_zipf_is_skewed() {
        let perm = Arc::new(permutation(1000, 1));
        let mut a = Sampler::new(Keys::Zipf, 1000, 7, perm.clone());
        let mut b = Sampler::new(Keys::Zipf, 1000, 7, perm.clone());
        let mut hits = vec![0u32; 1000];
        for _ in 0..10_000 {
            let x = a.next_index();
            assert_eq!(x, b.next_index());
            hits[x] += 1;
        }
        let hottest = perm[0] as usize;
        assert!(hits[hottest] > 500, "rank 1 drawn {} times", hits[hottest]);
        let mut u = Sampler::new(Keys::Uniform, 1000, 7, perm);
        let max = (0..10_000).fold(vec![0u32; 1000], |mut h, _| {
            h[u.next_index()] += 1;
            h
        });
        assert!(max.iter().all(|&c| c < 60));
    }

    #[test]
    fn drop_and_warm_touch_every_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/x"), vec![1u8; 5000]).unwrap();
        std::fs::write(dir.path().join("y"), b"yy").unwrap();
        assert_eq!(drop_cache(dir.path()), 2);
        assert_eq!(warm_cache(dir.path()), 5002);
    }
}
