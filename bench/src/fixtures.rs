//! Stores under test, each in a scratch directory or a fresh PostgreSQL
//! schema that is dropped afterwards.
//!
//! Stores are opened by engine URL through the engine registry
//! (store-registry, ADR-027), like the binary's. The two fixtures that
//! hand back their engine for its counters ([`sqlite_store`],
//! [`postgres_store`]: `stats()`, which no engine trait carries) open the
//! engine type itself.

use std::path::Path;
use std::sync::Mutex;

use sqlx::postgres::{PgPool, PgPoolOptions};
use store_core::{Mode, Namespace, Store, MAX_THRESHOLD};
use store_pg::plumbing::sql;
use store_postgres::PostgresEngine;
use store_sqlite::{Durability, SqliteEngine, SqliteOptions};

/// Errors of the bench harness, as text.
pub type BenchResult<T> = Result<T, String>;

/// Converts any displayable error.
pub fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The PostgreSQL the suite uses: `BLOBPOOL_BENCH_PG`, else `DATABASE_URL`,
/// else the local test server.
pub fn pg_url() -> String {
    std::env::var("BLOBPOOL_BENCH_PG")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The namespace every benchmark writes into.
pub fn ns() -> Namespace {
    Namespace::new("bench").expect("valid namespace")
}

/// A store over the engines `kv` and `large` name (registry URLs, e.g.
/// `sqlite://DIR/kv.sqlite`, `file://DIR/large`), in `mode` (default: the
/// builder's).
pub async fn open_store(
    kv: &str,
    large: Option<&str>,
    options: &store_registry::Options,
    mode: Option<Mode>,
) -> BenchResult<Store> {
    open_store_with(kv, large, options, mode, true).await
}

/// [`open_store`], with large puts building outboards or not
/// (`StoreBuilder::outboards_at_put`, ADR-032).
pub async fn open_store_with(
    kv: &str,
    large: Option<&str>,
    options: &store_registry::Options,
    mode: Option<Mode>,
    outboards_at_put: bool,
) -> BenchResult<Store> {
    let registry = store_registry::Registry::default();
    let mut b = Store::builder()
        .kv_shared(registry.open_kv(kv, options).await.map_err(err)?)
        .outboards_at_put(outboards_at_put);
    if let Some(large) = large {
        if let Some(l) = registry.open_large(large, options).await.map_err(err)? {
            b = b.large_shared(l);
        }
    }
    if let Some(mode) = mode {
        b = b.mode(mode);
    }
    b.build().await.map_err(err)
}

/// A store whose non-empty entries all take the large-tier put path: the
/// local engine at `dir` (`Some`) or the in-memory engine (`None`), with
/// or without outboards built at put — the outboard-overhead rows.
pub async fn large_path_store(
    dir: Option<&Path>,
    fsync: bool,
    outboards_at_put: bool,
) -> BenchResult<Store> {
    let options = store_registry::Options {
        fsync,
        ..store_registry::Options::default()
    };
    let large = match dir {
        Some(d) => url("file", d),
        None => "mem://".to_string(),
    };
    open_store_with(
        "mem://",
        Some(&large),
        &options,
        Some(Mode::DualTier { threshold: 0 }),
        outboards_at_put,
    )
    .await
}

/// A `file://` or `sqlite://` URL of `path`.
fn url(scheme: &str, path: &Path) -> String {
    format!("{scheme}://{}", path.display())
}

/// A store with only the in-memory engine (`MemOnly`).
pub async fn mem_store() -> BenchResult<Store> {
    open_store(
        "mem://",
        None,
        &store_registry::Options::default(),
        Some(Mode::MemOnly),
    )
    .await
}

/// A kv-only store over SQLite at `dir/kv.sqlite` (any size up to
/// [`MAX_THRESHOLD`] goes to SQLite). Returns the engine for its stats.
pub async fn sqlite_store(
    dir: &Path,
    durability: Durability,
) -> BenchResult<(Store, SqliteEngine)> {
    let engine = SqliteEngine::open(
        dir.join("kv.sqlite"),
        SqliteOptions {
            durability,
            ..SqliteOptions::default()
        },
    )
    .await
    .map_err(err)?;
    let store = Store::builder()
        .kv(engine.clone())
        .mode(Mode::KvOnly {
            threshold: MAX_THRESHOLD,
        })
        .build()
        .await
        .map_err(err)?;
    Ok((store, engine))
}

/// What a `perf` probe (`bench/examples/*_probe.rs`) runs on: its two
/// arguments (how many operations, default `default_ops`; the entry size
/// in KiB, default 1024), and a local store in a fresh directory.
pub struct Probe {
    /// Operations to run.
    pub ops: usize,
    /// The entry size in KiB.
    pub kib: usize,
    /// The store.
    pub store: Store,
    _dir: tempfile::TempDir,
}

impl Probe {
    /// Parses the probe's arguments and opens its store (`fsync` as
    /// [`local_store`]).
    pub async fn open(default_ops: usize, fsync: bool) -> BenchResult<Probe> {
        let mut args = std::env::args().skip(1);
        let mut arg = |default: usize| -> BenchResult<usize> {
            args.next()
                .map(|a| a.parse().map_err(|e| format!("{a}: {e}")))
                .transpose()
                .map(|a| a.unwrap_or(default))
        };
        let (ops, kib) = (arg(default_ops)?, arg(1024)?);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let store = local_store(dir.path(), fsync).await?;
        Ok(Probe {
            ops,
            kib,
            store,
            _dir: dir,
        })
    }
}

/// A store whose every non-empty entry goes to the local engine at
/// `dir/large` (dual-tier with threshold 0; the kv tier is an in-memory
/// engine that only ever holds the empty entry).
pub async fn local_store(dir: &Path, fsync: bool) -> BenchResult<Store> {
    let options = store_registry::Options {
        fsync,
        ..store_registry::Options::default()
    };
    open_store(
        "mem://",
        Some(&url("file", &dir.join("large"))),
        &options,
        Some(Mode::DualTier { threshold: 0 }),
    )
    .await
}

/// [`local_store`] with the local engine's open-file cache off
/// (`open_files = 0`, TUNING.md §local-small-reads): every small read opens its file in one
/// blocking call — the path the cached rows are shown beside.
pub async fn local_store_uncached(dir: &Path, fsync: bool) -> BenchResult<Store> {
    let options = store_registry::Options {
        fsync,
        ..store_registry::Options::default()
    };
    let registry = store_registry::Registry::default();
    // The setting is the local engine's only (the mem kv tier takes none).
    let large = registry
        .open_large(
            &url("file", &dir.join("large")),
            &options.clone().param("open_files", "0"),
        )
        .await
        .map_err(err)?
        .ok_or_else(|| err("file:// opened no large engine"))?;
    Store::builder()
        .kv_shared(registry.open_kv("mem://", &options).await.map_err(err)?)
        .large_shared(large)
        .mode(Mode::DualTier { threshold: 0 })
        .build()
        .await
        .map_err(err)
}

/// The local large engine on the same directory as [`local_store`]'s, opened
/// without a store: its `read_range` is the unverified engine read the
/// verified range row compares with (ADR-032).
pub async fn local_large_engine(
    dir: &Path,
    fsync: bool,
) -> BenchResult<std::sync::Arc<dyn store_types::LargeEngine>> {
    let options = store_registry::Options {
        fsync,
        ..store_registry::Options::default()
    };
    store_registry::Registry::default()
        .open_large(&url("file", &dir.join("large")), &options)
        .await
        .map_err(err)?
        .ok_or_else(|| err("file:// opened no large engine"))
}

/// The default composite: SQLite (`synchronous=FULL`) for entries up to the
/// default 64 KiB threshold, durable local files above it.
pub async fn composite_store(dir: &Path) -> BenchResult<Store> {
    open_store(
        &url("sqlite", &dir.join("kv.sqlite")),
        Some(&url("file", &dir.join("large"))),
        &store_registry::Options::default(),
        None,
    )
    .await
}

/// The default composite's layout at the peers' durability: SQLite
/// `synchronous=NORMAL` (a process crash loses nothing acknowledged, a power
/// loss may lose the last commits) and local files renamed into place without
/// fsync — the like-for-like configuration the put rows against cacache and
/// iroh-blobs (neither of which syncs before answering) are judged on.
pub async fn composite_store_unsynced(dir: &Path) -> BenchResult<Store> {
    let kv = SqliteOptions {
        durability: Durability::Normal,
        ..SqliteOptions::default()
    };
    let large = store_registry::Options {
        fsync: false,
        ..store_registry::Options::default()
    };
    sqlite_local_store(dir, kv, &large).await
}

/// The default composite's layout (SQLite at `dir/kv.sqlite`, local files
/// at `dir/large`, default threshold) with these engine options.
async fn sqlite_local_store(
    dir: &Path,
    kv: SqliteOptions,
    large: &store_registry::Options,
) -> BenchResult<Store> {
    sqlite_local_store_window(dir, kv, large, None).await
}

/// [`composite_store`] whose GC delete window is `window` (zero: a
/// sweep's staged garbage is due at the next sweep) — the tail-latency
/// rounds with a sweep.
pub async fn composite_store_window(dir: &Path, window: std::time::Duration) -> BenchResult<Store> {
    sqlite_local_store_window(
        dir,
        SqliteOptions::default(),
        &store_registry::Options::default(),
        Some(window),
    )
    .await
}

async fn sqlite_local_store_window(
    dir: &Path,
    kv: SqliteOptions,
    large: &store_registry::Options,
    window: Option<std::time::Duration>,
) -> BenchResult<Store> {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), kv)
        .await
        .map_err(err)?;
    let large = store_registry::Registry::default()
        .open_large(&url("file", &dir.join("large")), large)
        .await
        .map_err(err)?
        .ok_or_else(|| err("file:// opened no large engine"))?;
    let mut b = Store::builder().kv(kv).large_shared(large);
    if let Some(w) = window {
        b = b.window(w);
    }
    b.build().await.map_err(err)
}

/// [`composite_store`] with the SQLite engine's hot-entry cache turned off
/// (`cache_bytes: 0`, TUNING.md §sqlite-hot-cache): every small get reads the file on a reader
/// connection — the cold path the "hot" rows are shown beside.
pub async fn composite_store_uncached(dir: &Path) -> BenchResult<Store> {
    let kv = SqliteOptions {
        cache_bytes: 0,
        ..SqliteOptions::default()
    };
    sqlite_local_store(dir, kv, &store_registry::Options::default()).await
}

/// A kv-only store over the PostgreSQL engine in `pg`'s schema.
pub async fn postgres_store(pg: &PgScope) -> BenchResult<(Store, PostgresEngine)> {
    let engine = PostgresEngine::connect(&pg.url, &pg.schema)
        .await
        .map_err(err)?;
    let store = Store::builder()
        .kv(engine.clone())
        .mode(Mode::KvOnly {
            threshold: MAX_THRESHOLD,
        })
        .build()
        .await
        .map_err(err)?;
    Ok((store, engine))
}

/// A store whose every non-empty entry goes to the pg-lo engine in `pg`'s
/// schema (dual-tier, threshold 0, in-memory kv).
pub async fn pglo_store(pg: &PgScope) -> BenchResult<Store> {
    let rest = pg.url.split_once("://").map_or(&pg.url[..], |(_, r)| r);
    let options = store_registry::Options {
        schema: pg.schema.clone(),
        ..store_registry::Options::default()
    };
    open_store(
        "mem://",
        Some(&format!("pglo://{rest}")),
        &options,
        Some(Mode::DualTier { threshold: 0 }),
    )
    .await
}

/// Removes every regular file below `dir` (directories stay), ignoring
/// errors. Put workloads that write files call it between timed batches
/// (untimed): see `docs/BENCHMARKS.md` on page-cache growth in this VM.
pub fn wipe_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => wipe_files(&e.path()),
            Ok(_) => {
                let _ = std::fs::remove_file(e.path());
            }
            Err(_) => {}
        }
    }
}

/// Prefix of the schemas this suite creates.
const SCHEMA_PREFIX: &str = "blobpool_bench_";

/// A fresh PostgreSQL schema for one run, with its own raw-ceiling tables.
/// [`PgScope::cleanup`] unlinks every large object the run created and drops
/// the schema.
pub struct PgScope {
    /// Server URL.
    pub url: String,
    /// The schema (`blobpool_bench_<pid>_<n>`).
    pub schema: String,
    /// A pool for the raw ceilings and the cleanup.
    pub pool: PgPool,
    raw_oids: Mutex<Vec<u32>>,
}

impl PgScope {
    /// Connects, removes schemas left by crashed earlier runs (whose process
    /// is gone) and names a fresh schema (created by the engines).
    pub async fn new() -> BenchResult<Self> {
        let url = pg_url();
        let pool = PgPoolOptions::new()
            .max_connections(20)
            .connect(&url)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL at {url}: {e}"))?;
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'blobpool\\_bench\\_%'",
        )
        .fetch_all(&pool)
        .await
        .map_err(err)?;
        for schema in stale {
            let pid = schema[SCHEMA_PREFIX.len()..]
                .split('_')
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                drop_schema(&pool, &schema).await?;
            }
        }
        let schema = format!(
            "{SCHEMA_PREFIX}{}_{}",
            std::process::id(),
            crate::data::unique()
        );
        store_pg::plumbing::create_schema(&pool, &schema)
            .await
            .map_err(err)?;
        Ok(PgScope {
            url,
            schema,
            pool,
            raw_oids: Mutex::new(Vec::new()),
        })
    }

    /// Records a large object created by a raw ceiling, for cleanup.
    pub fn record_oid(&self, oid: u32) {
        self.raw_oids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(oid);
    }

    /// Unlinks the run's large objects and drops the schema.
    pub async fn cleanup(&self) -> BenchResult<()> {
        let oids = std::mem::take(&mut *self.raw_oids.lock().unwrap_or_else(|p| p.into_inner()));
        for chunk in oids.chunks(1000) {
            let chunk: Vec<sqlx::postgres::types::Oid> = chunk
                .iter()
                .map(|o| sqlx::postgres::types::Oid(*o))
                .collect();
            sqlx::query("SELECT lo_unlink(o) FROM unnest($1::oid[]) AS o WHERE EXISTS (SELECT 1 FROM pg_largeobject_metadata m WHERE m.oid = o)")
                .bind(&chunk)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        drop_schema(&self.pool, &self.schema).await
    }
}

/// Unlinks the large objects named in `<schema>.lo_entries` (if any), then
/// drops the schema.
async fn drop_schema(pool: &PgPool, schema: &str) -> BenchResult<()> {
    let has_lo: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'lo_entries')",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .map_err(err)?;
    if has_lo {
        sqlx::query(sql(
            schema,
            "SELECT lo_unlink(e.oid) FROM {schema}.lo_entries e
             WHERE EXISTS (SELECT 1 FROM pg_largeobject_metadata m WHERE m.oid = e.oid)",
        ))
        .execute(pool)
        .await
        .map_err(err)?;
    }
    sqlx::query(sql(schema, "DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(pool)
        .await
        .map_err(err)?;
    Ok(())
}
