//! The put pipeline (`store_core::Store::put`) against a model.
//!
//! A store over `store-mem` engines (`MemOnly`, `KvOnly` or `DualTier`
//! with a small threshold, sometimes one next to the 256 KiB chunk size)
//! takes a sequence of puts. Each put's body comes from a reader that
//! yields arbitrary chunk sizes, returns `Pending` now and then, and may
//! fail at a chosen offset; its declared length is right, wrong or absent
//! and its expected digest right, wrong or absent. For each put the model
//! predicts the outcome from the documented rules (docs/ARCHITECTURE.md,
//! "How a put flows"; `Store::put`):
//!
//! - a declared length over the limit of a store without a large tier:
//!   `TooLarge { limit, got: declared }`, nothing read;
//! - otherwise the pipeline reads at most the declared length (or the
//!   limit) plus one byte before it decides; a body of another length
//!   than declared is `LengthMismatch { declared, actual }` with `actual`
//!   the body's length, or one past the declaration when longer; an
//!   undeclared body over the limit is `TooLarge { limit, got: limit + 1 }`
//!   without a large tier and goes to the large tier with one;
//! - a body that does not hash to the expected digest is `Verification`;
//! - a read error the pipeline reaches fails the put, one it never reads
//!   up to changes nothing;
//! - otherwise the receipt has the right digest, size and tier
//!   (`deduplicated` exactly when the model already holds the entry).
//!
//! After every put, successful or not, both engines hold exactly the
//! model's entries (nothing half-written or failed is visible), and
//! `get`, `stat` and `has` of each entry answer exactly its bytes, size
//! and tier.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use arbitrary::Arbitrary;
use bytes::Bytes;
use store_core::{Mode, Store};
use store_mem::MemEngine;
use store_types::{Digest, Engine, Error, Key, Namespace, Tier, CHUNK_SIZE};
use tokio::io::{AsyncRead, ReadBuf};

/// The fuzzer's input: a store shape and the puts it takes.
#[derive(Arbitrary, Debug)]
pub struct Input {
    mode: ModeChoice,
    threshold: u16,
    puts: Vec<PutCase>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ModeChoice {
    MemOnly,
    KvOnly,
    DualTier,
}

#[derive(Arbitrary, Debug)]
struct PutCase {
    /// Which of two namespaces.
    second_namespace: bool,
    body: BodySpec,
    /// Chunk sizes the reader yields, in turn (0: `Pending` once).
    chunks: Vec<u16>,
    len: LenChoice,
    expect: ExpectChoice,
    /// The reader fails when asked for the byte at this offset (modulo
    /// the body length plus one).
    fail_at: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum BodySpec {
    Bytes(Vec<u8>),
    /// `len` (modulo two chunks and a bit) bytes repeating `pattern`.
    Repeat {
        pattern: Vec<u8>,
        len: u32,
    },
    /// The body of an earlier put of this input (a duplicate).
    Earlier(u8),
}

#[derive(Arbitrary, Debug)]
enum LenChoice {
    Right,
    /// The body's length plus this (never zero) offset, at least 0.
    Off(i32),
    /// Any declared length.
    Any(u64),
    Undeclared,
}

#[derive(Arbitrary, Debug)]
enum ExpectChoice {
    Right,
    Wrong([u8; 32]),
    None,
}

/// A body that yields its bytes in the chunk sizes given.
struct Chunked {
    data: Bytes,
    pos: usize,
    sizes: Vec<u16>,
    turn: usize,
    pended: bool,
    fail_at: Option<usize>,
}

impl AsyncRead for Chunked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.fail_at == Some(me.pos) {
            return Poll::Ready(Err(io::Error::other("the body's source failed")));
        }
        if me.pos == me.data.len() {
            return Poll::Ready(Ok(()));
        }
        let size = if me.sizes.is_empty() {
            CHUNK_SIZE
        } else {
            let s = me.sizes[me.turn % me.sizes.len()];
            me.turn += 1;
            if s == 0 && !me.pended {
                me.pended = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Long bodies in coarser chunks, so a run stays fast.
            let scale = if me.data.len() > 65536 { 16 } else { 1 };
            (s as usize).max(1) * scale
        };
        me.pended = false;
        let end = me.fail_at.unwrap_or(usize::MAX).min(me.data.len());
        let n = size.min(end - me.pos).min(buf.remaining());
        buf.put_slice(&me.data[me.pos..me.pos + n]);
        me.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// What the model says a put does.
#[derive(Debug, PartialEq)]
enum Outcome {
    Stored(Tier),
    TooLarge { limit: u64, got: u64 },
    LengthMismatch { declared: u64, actual: u64 },
    Verification { expected: Digest, actual: Digest },
    ReadFailed,
}

/// The model: the outcome of putting `n` bytes hashing to `digest`, with
/// declared length `len` and expected digest `expect`, whose reader fails
/// at `fail_at`.
fn model(
    mode: Mode,
    n: u64,
    digest: Digest,
    len: Option<u64>,
    expect: Option<Digest>,
    fail_at: Option<u64>,
) -> Outcome {
    let (limit, spill) = match mode {
        Mode::MemOnly => (u64::MAX, false),
        Mode::KvOnly { threshold } => (threshold, false),
        Mode::DualTier { threshold } => (threshold, true),
    };
    // How far the pipeline reads (it asks for the byte at every offset
    // below this, and for EOF at `n` when `n` is below it), and where the
    // body goes if nothing fails.
    let (demand, decided) = match len {
        Some(d) if d > limit && !spill => (0, Outcome::TooLarge { limit, got: d }),
        Some(d) if d > limit => (d.saturating_add(1), large(n, len, digest, expect)),
        _ => {
            let cap = len.unwrap_or(limit).min(limit).saturating_add(1);
            let got = n.min(cap);
            match len {
                Some(d) if got != d => (
                    cap,
                    Outcome::LengthMismatch {
                        declared: d,
                        actual: got,
                    },
                ),
                _ if got > limit && !spill => (cap, Outcome::TooLarge { limit, got }),
                _ if got > limit => (u64::MAX, large(n, len, digest, expect)),
                _ => (cap, verified(digest, expect, Tier::Kv)),
            }
        }
    };
    match fail_at {
        Some(k) if k < demand => Outcome::ReadFailed,
        _ => decided,
    }
}

fn large(n: u64, len: Option<u64>, digest: Digest, expect: Option<Digest>) -> Outcome {
    match len {
        Some(d) if d != n => Outcome::LengthMismatch {
            declared: d,
            actual: n.min(d.saturating_add(1)),
        },
        _ => verified(digest, expect, Tier::Large),
    }
}

fn verified(actual: Digest, expect: Option<Digest>, tier: Tier) -> Outcome {
    match expect {
        Some(expected) if expected != actual => Outcome::Verification { expected, actual },
        _ => Outcome::Stored(tier),
    }
}

fn observed(r: &Result<store_core::PutReceipt, Error>) -> Outcome {
    match r {
        Ok(receipt) => Outcome::Stored(receipt.tier),
        Err(Error::TooLarge { limit, got }) => Outcome::TooLarge {
            limit: *limit,
            got: *got,
        },
        Err(Error::LengthMismatch { declared, actual }) => Outcome::LengthMismatch {
            declared: *declared,
            actual: *actual,
        },
        Err(Error::Verification { expected, actual }) => Outcome::Verification {
            expected: *expected,
            actual: *actual,
        },
        // The reader's failure, as whatever media error the pipeline makes
        // of an `io::Error` (matched by variant only: its payload is the
        // error crate's business).
        Err(Error::Io { .. }) | Err(Error::Backend { .. }) => Outcome::ReadFailed,
        Err(e) => panic!("unexpected put error: {e:?}"),
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

fn threshold_of(t: u16) -> u64 {
    if t & 0x8000 != 0 {
        // Around the pipeline's chunk size.
        CHUNK_SIZE as u64 - 2 + u64::from(t % 5)
    } else {
        u64::from(t % 300)
    }
}

/// Runs `input`'s puts and checks each against the model.
pub fn check(input: Input) {
    runtime().block_on(run(input));
}

async fn run(input: Input) {
    let kv = MemEngine::new();
    let large = MemEngine::new();
    let threshold = threshold_of(input.threshold);
    let (mode, builder) = match input.mode {
        ModeChoice::MemOnly => (Mode::MemOnly, Store::builder().kv(kv.clone())),
        ModeChoice::KvOnly => (Mode::KvOnly { threshold }, Store::builder().kv(kv.clone())),
        ModeChoice::DualTier => (
            Mode::DualTier { threshold },
            Store::builder().kv(kv.clone()).large(large.clone()),
        ),
    };
    let store = builder.mode(mode).build().await.expect("the store builds");
    let namespaces = [Namespace::new("a").unwrap(), Namespace::new("b").unwrap()];
    // The model: what each tier holds.
    let mut held: BTreeMap<Key, (Bytes, Tier)> = BTreeMap::new();
    let mut bodies: Vec<Bytes> = Vec::new();
    for case in input.puts.into_iter().take(6) {
        let ns = &namespaces[usize::from(case.second_namespace)];
        let data: Bytes = match case.body {
            BodySpec::Bytes(b) => b.into(),
            BodySpec::Repeat { pattern, len } => {
                let len = len as usize % (2 * CHUNK_SIZE + 17);
                let pattern = if pattern.is_empty() { vec![0] } else { pattern };
                pattern
                    .iter()
                    .copied()
                    .cycle()
                    .take(len)
                    .collect::<Vec<u8>>()
                    .into()
            }
            BodySpec::Earlier(i) if !bodies.is_empty() => {
                bodies[usize::from(i) % bodies.len()].clone()
            }
            BodySpec::Earlier(_) => Bytes::new(),
        };
        bodies.push(data.clone());
        let n = data.len() as u64;
        let digest = Digest::of(&data);
        let len = match case.len {
            LenChoice::Right => Some(n),
            LenChoice::Off(off) => {
                let off = if off == 0 { 1 } else { i64::from(off) };
                Some(u64::try_from(n as i64 + off).unwrap_or(0))
            }
            LenChoice::Any(d) => Some(d),
            LenChoice::Undeclared => None,
        };
        let expect = match case.expect {
            ExpectChoice::Right => Some(digest),
            ExpectChoice::Wrong(b) => Some(Digest::from_bytes(b)),
            ExpectChoice::None => None,
        };
        let fail_at = case.fail_at.map(|k| u64::from(k) % (n + 1));
        let want = model(mode, n, digest, len, expect, fail_at);
        let key = Key::new(ns.clone(), digest);
        let was_held = held.contains_key(&key);
        let body = Chunked {
            data: data.clone(),
            pos: 0,
            sizes: case.chunks,
            turn: 0,
            pended: false,
            fail_at: fail_at.map(|k| k as usize),
        };
        let got = store
            .put_opts(ns, body, store_core::PutOptions { len, expect })
            .await;
        let what = format!(
            "{mode:?}: put of {n} bytes, len {len:?}, expect {expect:?}, fail at {fail_at:?}"
        );
        assert_eq!(observed(&got), want, "{what}: {:?}", got.as_ref().err());
        if let Ok(receipt) = got {
            assert_eq!(receipt.digest, digest, "{what}");
            assert_eq!(receipt.size, n, "{what}");
            assert_eq!(receipt.key(), &key, "{what}");
            assert_eq!(receipt.deduplicated, was_held, "{what}");
            held.insert(key, (data, receipt.tier));
        }
        check_state(&store, &kv, &large, &namespaces, &held, &what).await;
    }
}

/// Both engines hold exactly `held`, and the store reads it back.
async fn check_state(
    store: &Store,
    kv: &MemEngine,
    large: &MemEngine,
    namespaces: &[Namespace],
    held: &BTreeMap<Key, (Bytes, Tier)>,
    what: &str,
) {
    for (tier, engine) in [(Tier::Kv, kv), (Tier::Large, large)] {
        for ns in namespaces {
            let listed = engine.scan(ns, None, usize::MAX).await.expect("a mem scan");
            let want: Vec<(Digest, u64)> = held
                .iter()
                .filter(|(k, (_, t))| &k.namespace == ns && *t == tier)
                .map(|(k, (b, _))| (k.digest, b.len() as u64))
                .collect();
            assert_eq!(listed, want, "{what}: {tier:?} tier of {ns}");
        }
    }
    for (key, (bytes, tier)) in held {
        let stat = store.stat(key).await.expect("stat").expect("present");
        assert_eq!(
            (stat.size, stat.tier),
            (bytes.len() as u64, *tier),
            "{what}"
        );
        assert!(store.has(key).await.expect("has"), "{what}");
        let blob = store.get(key).await.expect("get").expect("present");
        assert_eq!(blob.tier(), *tier, "{what}");
        assert_eq!(
            &blob.bytes().await.expect("verified bytes"),
            bytes,
            "{what}"
        );
    }
}
