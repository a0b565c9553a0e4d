//! Composites (engine combinations) and the harness that opens them.

use std::sync::Arc;
use std::time::Duration;

use store_core::{Clock, ManualClock, Mode, Namespace, Store};
use store_local::{LocalEngine, LocalOptions};
use store_mem::MemEngine;
use store_object::object_store::memory::InMemory;
use store_object::object_store::ObjectStore;
use store_object::s3_testing::TestBucket;
use store_object::{ObjectEngine, ObjectOptions};
use store_pglo::PgLoEngine;
use store_postgres::testing::{advance_db_clock, set_db_clock};
use store_postgres::PostgresEngine;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Engine, Key, KvEngine, LargeEngine, Timestamp};

/// The threshold every tiered composite runs the suite with: small, so the
/// boundary cases are cheap, and far below any engine's limits.
pub const THRESHOLD: u64 = 4096;

/// A kv engine choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSpec {
    /// `store-mem`.
    Mem,
    /// `store-sqlite` in a temp dir.
    Sqlite,
    /// `store-postgres` in a fresh schema.
    Postgres,
}

/// A large engine choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LargeSpec {
    /// `store-mem`.
    Mem,
    /// `store-local` in a temp dir.
    Local,
    /// `store-pglo` in a fresh schema.
    PgLo,
    /// `store-object` over an object_store backend.
    Object(ObjectBackend),
}

/// The object_store backend of a [`LargeSpec::Object`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectBackend {
    /// `InMemory` (kept across reopen).
    Memory,
    /// `LocalFileSystem` in a temp dir (`file://`).
    LocalFs,
    /// A fresh bucket on the S3-compatible test server
    /// (`BLOBPOOL_TEST_S3_ENDPOINT`, moto).
    S3,
}

impl ObjectBackend {
    /// Engine options for the contract suite: a low multipart threshold so
    /// most large-tier blobs go through staging and copy-if-not-exists.
    pub fn options(self) -> ObjectOptions {
        ObjectOptions {
            multipart_threshold: 8 << 10,
            part_size: if self == ObjectBackend::S3 {
                5 << 20
            } else {
                1 << 20
            },
            ..ObjectOptions::default()
        }
    }
}

/// One composite of the contract matrix.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Display name.
    pub name: &'static str,
    /// The kv engine.
    pub kv: KvSpec,
    /// The large engine (dual-tier) or none.
    pub large: Option<LargeSpec>,
    /// `mem-only` mode instead of kv-only.
    pub mem_only: bool,
    /// Both engines wrapped in engine layers ([`crate::layered::wrap`]).
    pub layered: bool,
}

impl Spec {
    /// The store mode this composite runs in.
    pub fn mode(&self) -> Mode {
        if self.mem_only {
            Mode::MemOnly
        } else if self.large.is_some() {
            Mode::DualTier {
                threshold: THRESHOLD,
            }
        } else {
            Mode::KvOnly {
                threshold: THRESHOLD,
            }
        }
    }

    /// Whether the instance's window host is durable (a SQL engine).
    pub fn durable_window(&self) -> bool {
        matches!(self.kv, KvSpec::Sqlite | KvSpec::Postgres) || self.large == Some(LargeSpec::PgLo)
    }

    /// Whether any engine needs PostgreSQL.
    pub fn uses_postgres(&self) -> bool {
        self.kv == KvSpec::Postgres || self.large == Some(LargeSpec::PgLo)
    }

    /// Whether the large tier needs the S3 test server.
    pub fn uses_s3(&self) -> bool {
        self.large == Some(LargeSpec::Object(ObjectBackend::S3))
    }
}

/// Per-harness knobs.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Delete-window length.
    pub window: Duration,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            window: Duration::from_secs(60),
        }
    }
}

pub(crate) enum Kv {
    Mem(MemEngine),
    Sqlite(Arc<SqliteEngine>),
    Pg(Arc<PostgresEngine>),
}

pub(crate) enum Large {
    Mem(MemEngine),
    Local(Arc<LocalEngine>),
    PgLo(Arc<PgLoEngine>),
    Object(Arc<ObjectEngine>),
}

/// Storage that outlives a store instance (so tests can reopen).
pub struct Env {
    dir: tempfile::TempDir,
    pg: Option<crate::pg::PgSchemas>,
    /// The `InMemory` object store of [`ObjectBackend::Memory`].
    object_mem: Arc<dyn ObjectStore>,
    /// The bucket of [`ObjectBackend::S3`].
    bucket: Option<TestBucket>,
    /// Holds deletes of the tier big blobs go to (see [`Harness::open_hooked`]).
    hook: Option<Arc<crate::hook::DeleteHook>>,
}

/// An opened composite.
pub struct Harness {
    /// The store under test.
    pub store: Store,
    /// The injected GC clock. Move time with [`Harness::advance`], which
    /// also moves the database's clock when PostgreSQL hosts the window.
    pub clock: ManualClock,
    /// Which composite this is.
    pub spec: Spec,
    /// The options it was opened with.
    pub opts: Opts,
    env: Arc<Env>,
    kv: Kv,
    large: Option<Large>,
    /// The pool and schema of the window host when it is PostgreSQL: its
    /// GC clock (`gc_now()`, which judges the window there) is kept stopped
    /// at `clock`'s reading.
    db_clock: Option<(sqlx::PgPool, String)>,
}

/// The namespace most cases use.
pub fn ns() -> Namespace {
    Namespace::new("contract").expect("valid")
}

impl Harness {
    /// Opens `spec` with default options.
    pub async fn open(spec: Spec) -> Harness {
        Self::open_with(spec, Opts::default()).await
    }

    /// Opens `spec` on fresh storage.
    pub async fn open_with(spec: Spec, opts: Opts) -> Harness {
        Self::open_env(spec, opts, None).await
    }

    /// Opens `spec` with the tier that big blobs go to (the large tier, or
    /// the kv tier of a kv-only or mem-only composite) wrapped in a
    /// [`crate::hook`] wrapper controlled by `hook`.
    pub async fn open_hooked(
        spec: Spec,
        opts: Opts,
        hook: Arc<crate::hook::DeleteHook>,
    ) -> Harness {
        Self::open_env(spec, opts, Some(hook)).await
    }

    async fn open_env(
        spec: Spec,
        opts: Opts,
        hook: Option<Arc<crate::hook::DeleteHook>>,
    ) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let pg = if spec.uses_postgres() {
            Some(crate::pg::PgSchemas::create().await)
        } else {
            None
        };
        let bucket = if spec.uses_s3() {
            Some(TestBucket::create().await)
        } else {
            None
        };
        let env = Arc::new(Env {
            dir,
            pg,
            object_mem: Arc::new(InMemory::new()),
            bucket,
            hook,
        });
        let clock = ManualClock::new(Timestamp(1_000_000));
        Self::build(spec, opts, env, clock, None, None).await
    }

    async fn build(
        spec: Spec,
        opts: Opts,
        env: Arc<Env>,
        clock: ManualClock,
        mem_kv: Option<MemEngine>,
        mem_large: Option<MemEngine>,
    ) -> Harness {
        let kv = match spec.kv {
            KvSpec::Mem => Kv::Mem(mem_kv.unwrap_or_default()),
            KvSpec::Sqlite => Kv::Sqlite(Arc::new(
                SqliteEngine::open(env.dir.path().join("kv.sqlite"), SqliteOptions::default())
                    .await
                    .expect("open sqlite"),
            )),
            KvSpec::Postgres => {
                let pg = env.pg.as_ref().expect("postgres env");
                Kv::Pg(Arc::new(
                    PostgresEngine::connect(&pg.url, &pg.kv_schema)
                        .await
                        .expect("open postgres"),
                ))
            }
        };
        let large = match spec.large {
            None => None,
            Some(LargeSpec::Mem) => Some(Large::Mem(mem_large.unwrap_or_default())),
            Some(LargeSpec::Local) => Some(Large::Local(Arc::new(
                LocalEngine::open(env.dir.path().join("large"), LocalOptions::default())
                    .await
                    .expect("open local"),
            ))),
            Some(LargeSpec::PgLo) => {
                let pg = env.pg.as_ref().expect("postgres env");
                Some(Large::PgLo(Arc::new(
                    PgLoEngine::connect(&pg.url, &pg.lo_schema)
                        .await
                        .expect("open pg-lo"),
                )))
            }
            Some(LargeSpec::Object(backend)) => {
                let options = backend.options();
                let engine = match backend {
                    ObjectBackend::Memory => {
                        ObjectEngine::new(env.object_mem.clone(), options).await
                    }
                    ObjectBackend::LocalFs => {
                        let url = format!("file://{}", env.dir.path().join("objects").display());
                        ObjectEngine::from_url(&url, options).await
                    }
                    ObjectBackend::S3 => {
                        let bucket = env.bucket.as_ref().expect("S3 env");
                        Ok(bucket.engine("pool", options).await)
                    }
                };
                Some(Large::Object(Arc::new(engine.expect("open object engine"))))
            }
        };
        let mut b = Store::builder()
            .mode(spec.mode())
            .window(opts.window)
            .clock(Arc::new(clock.clone()));
        let mut kv_dyn: Arc<dyn KvEngine> = match &kv {
            Kv::Mem(e) => Arc::new(e.clone()),
            Kv::Sqlite(e) => e.clone(),
            Kv::Pg(e) => e.clone(),
        };
        let mut large_dyn: Option<Arc<dyn LargeEngine>> = match &large {
            None => None,
            Some(Large::Mem(e)) => Some(Arc::new(e.clone())),
            Some(Large::Local(e)) => Some(e.clone()),
            Some(Large::PgLo(e)) => Some(e.clone()),
            Some(Large::Object(e)) => Some(e.clone()),
        };
        if let Some(hook) = &env.hook {
            match (large_dyn.take(), spec.mode()) {
                (Some(l), Mode::DualTier { .. }) => {
                    large_dyn = Some(crate::hook::hooked_large(l, hook.clone()));
                }
                (l, _) => {
                    large_dyn = l;
                    kv_dyn = crate::hook::hooked_kv(kv_dyn, hook.clone());
                }
            }
        }
        if spec.layered {
            (kv_dyn, large_dyn) = crate::layered::wrap(kv_dyn, large_dyn);
        }
        b = b.kv_shared(kv_dyn);
        if let Some(l) = large_dyn {
            b = b.large_shared(l);
        }
        let store = b.build().await.expect("build store");
        // The window host judges by its own clock when it is PostgreSQL
        // (the kv engine when SQL-backed, else pg-lo): stop that clock at
        // the injected clock's reading, so the two agree exactly.
        let db_clock = match (&kv, &large) {
            (Kv::Pg(e), _) => Some((e.pool().clone(), e.schema().to_string())),
            (Kv::Mem(_), Some(Large::PgLo(e))) => Some((e.pool().clone(), e.schema().to_string())),
            _ => None,
        };
        if let Some((pool, schema)) = &db_clock {
            set_db_clock(pool, schema, clock.now())
                .await
                .expect("set the database clock");
        }
        Harness {
            store,
            clock,
            spec,
            opts,
            env,
            kv,
            large,
            db_clock,
        }
    }

    /// Moves time forward by `d`: the injected clock (in-process windows
    /// and pins, mem/local/sqlite hosts) and, when PostgreSQL hosts the
    /// window, the database's clock, which judges the window there.
    pub async fn advance(&self, d: Duration) {
        self.clock.advance(d);
        if let Some((pool, schema)) = &self.db_clock {
            advance_db_clock(pool, schema, d)
                .await
                .expect("advance the database clock");
        }
    }

    /// Drops the store and its engines and opens them again over the same
    /// storage (in-memory engines keep their data; in-process GC state —
    /// pins, in-process window — is lost, as in a restart).
    pub async fn reopen(self) -> Harness {
        let Harness {
            store,
            clock,
            spec,
            opts,
            env,
            kv,
            large,
            db_clock: _,
        } = self;
        drop(store);
        let mem_kv = match kv {
            Kv::Mem(e) => Some(e),
            _ => None,
        };
        let mem_large = match large {
            Some(Large::Mem(e)) => Some(e),
            _ => None,
        };
        Self::build(spec, opts, env, clock, mem_kv, mem_large).await
    }

    /// The kv engine as a plain engine.
    pub fn kv_engine(&self) -> Arc<dyn Engine> {
        match &self.kv {
            Kv::Mem(e) => Arc::new(e.clone()),
            Kv::Sqlite(e) => e.clone(),
            Kv::Pg(e) => e.clone(),
        }
    }

    /// The kv engine's named references (`KvEngine::refs`), if it can
    /// hold them.
    pub fn kv_refs(&self) -> Option<Arc<dyn store_types::RefStore>> {
        match &self.kv {
            Kv::Mem(e) => e.refs(),
            Kv::Sqlite(e) => e.refs(),
            Kv::Pg(e) => e.refs(),
        }
    }

    /// The large engine as a plain engine.
    pub fn large_engine(&self) -> Option<Arc<dyn Engine>> {
        self.large.as_ref().map(|l| -> Arc<dyn Engine> {
            match l {
                Large::Mem(e) => Arc::new(e.clone()),
                Large::Local(e) => e.clone(),
                Large::PgLo(e) => e.clone(),
                Large::Object(e) => e.clone(),
            }
        })
    }

    /// Flips a stored byte of `key`, in whichever tier holds it.
    pub async fn corrupt(&self, key: &Key) {
        let stat = self
            .store
            .stat(key)
            .await
            .unwrap()
            .expect("entry to corrupt");
        match (stat.tier, &self.kv, &self.large) {
            (store_types::Tier::Kv, Kv::Mem(e), _) => e.corrupt_one_byte(key).unwrap(),
            (store_types::Tier::Kv, Kv::Sqlite(e), _) => e.corrupt_one_byte(key).await.unwrap(),
            (store_types::Tier::Kv, Kv::Pg(e), _) => e.corrupt_one_byte(key).await.unwrap(),
            (store_types::Tier::Large, _, Some(Large::Mem(e))) => e.corrupt_one_byte(key).unwrap(),
            (store_types::Tier::Large, _, Some(Large::Local(e))) => {
                e.corrupt_one_byte(key).await.unwrap()
            }
            (store_types::Tier::Large, _, Some(Large::PgLo(e))) => {
                e.corrupt_one_byte(key).await.unwrap()
            }
            (store_types::Tier::Large, _, Some(Large::Object(e))) => {
                e.corrupt_one_byte(key).await.unwrap()
            }
            (tier, _, None) => panic!("{tier} entry in a store without a large tier"),
        }
    }

    /// Stage files (or stage objects) left in the large tier (0 for
    /// engines without them).
    pub async fn stage_files(&self) -> usize {
        match &self.large {
            Some(Large::Local(e)) => e.stage_file_count().expect("count stage files"),
            Some(Large::Object(e)) => e.stage_object_count().await.expect("count stage objects"),
            _ => 0,
        }
    }

    /// The PostgreSQL connection details, if any engine uses PostgreSQL.
    pub fn pg(&self) -> Option<&crate::pg::PgSchemas> {
        self.env.pg.as_ref()
    }
}
