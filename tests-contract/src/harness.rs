//! Composites (engine combinations) and the harness that opens them.
//!
//! A composite names its engines by registry URL (store-registry,
//! ADR-027), so the harness opens every engine the same way and reaches
//! each one's test hooks (corruption, stage counts, database clocks,
//! reopen of in-memory data) through [`store_registry::Testing`]: it names
//! no engine. URL templates may use
//!
//! - `{dir}`: the composite's scratch directory (kept across reopen);
//! - `{pg}`: the test database (`DATABASE_URL`) after its `postgres://`,
//!   with `{kv_schema}` and `{lo_schema}` two fresh schemas (dropped
//!   afterwards);
//! - `{s3}`: `s3://BUCKET` of a fresh bucket on the S3 test server
//!   (`BLOBPOOL_TEST_S3_ENDPOINT`), whose client settings the harness adds
//!   to the options.

use std::sync::Arc;
use std::time::Duration;

use store_core::{Clock, ManualClock, Mode, Namespace, Store};
use store_object::s3_testing::TestBucket;
use store_object::ObjectOptions;
use store_registry::{EngineSpec, Opened, Options, Registry, Testing};
use store_types::{Engine, Key, KvEngine, LargeEngine, Tier, Timestamp};

/// The threshold every tiered composite runs the suite with: small, so the
/// boundary cases are cheap, and far below any engine's limits.
pub const THRESHOLD: u64 = 4096;

/// The object-store engine options of the fleet tests over S3, which open
/// their engines directly (`fleet.rs`): a low multipart threshold so most
/// large-tier blobs go through staging and copy-if-not-exists, and S3's
/// smallest part size. The contract composites say the same in their URLs
/// (`?multipart_threshold=8KiB&part_size=5MiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectBackend {
    /// A bucket on the S3-compatible test server.
    S3,
}

impl ObjectBackend {
    /// The engine options.
    pub fn options(self) -> ObjectOptions {
        ObjectOptions {
            multipart_threshold: 8 << 10,
            part_size: 5 << 20,
            ..ObjectOptions::default()
        }
    }
}

/// One composite of the contract matrix.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Display name.
    pub name: &'static str,
    /// The kv engine's URL template.
    pub kv: &'static str,
    /// The large engine's URL template (dual-tier) or none.
    pub large: Option<&'static str>,
    /// `mem-only` mode instead of kv-only.
    pub mem_only: bool,
    /// Both engines wrapped in engine layers ([`crate::layered::wrap`]).
    pub layered: bool,
}

impl Spec {
    /// A kv-only composite (`mem_only`: mem-only mode instead).
    pub const fn kv(name: &'static str, kv: &'static str, mem_only: bool) -> Spec {
        Spec {
            name,
            kv,
            large: None,
            mem_only,
            layered: false,
        }
    }

    /// A dual-tier composite.
    pub const fn dual(name: &'static str, kv: &'static str, large: &'static str) -> Spec {
        Spec {
            name,
            kv,
            large: Some(large),
            mem_only: false,
            layered: false,
        }
    }

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

    fn templates(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.kv).chain(self.large)
    }

    /// Whether any engine needs PostgreSQL (`{pg}`).
    pub fn uses_postgres(&self) -> bool {
        self.templates().any(|t| t.contains("{pg}"))
    }

    /// Whether the large tier needs the S3 test server (`{s3}`).
    pub fn uses_s3(&self) -> bool {
        self.templates().any(|t| t.contains("{s3}"))
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

/// The registry the suite opens engines with (every engine, their test
/// hooks, S3, and the toy engine).
fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Storage that outlives a store instance (so tests can reopen).
pub struct Env {
    dir: tempfile::TempDir,
    pg: Option<crate::pg::PgSchemas>,
    /// The bucket of `{s3}`.
    bucket: Option<TestBucket>,
    /// Holds deletes of the tier big blobs go to (see [`Harness::open_hooked`]).
    hook: Option<Arc<crate::hook::DeleteHook>>,
}

impl Env {
    /// The engine a URL template names, placeholders filled in.
    fn resolve(&self, template: &str, tier: Tier) -> EngineSpec {
        let mut url = template.replace("{dir}", &self.dir.path().display().to_string());
        if let Some(pg) = &self.pg {
            let rest = pg.url.split_once("://").map_or(&pg.url[..], |(_, r)| r);
            url = url
                .replace("{pg}", rest)
                .replace("{kv_schema}", &pg.kv_schema)
                .replace("{lo_schema}", &pg.lo_schema);
            // A DATABASE_URL with a query of its own: the template's
            // `?schema=` joins it.
            if let Some(first) = url.find('?') {
                let (head, tail) = url.split_at(first + 1);
                url = format!("{head}{}", tail.replace('?', "&"));
            }
        }
        let mut options = Options::default();
        if let Some(bucket) = self.bucket.as_ref().filter(|_| template.contains("{s3}")) {
            url = url.replace("{s3}", &format!("s3://{}", bucket.name));
            for (k, v) in bucket.config() {
                options.params.insert(k.to_string(), v);
            }
        }
        registry()
            .resolve(&url, tier, &options)
            .unwrap_or_else(|e| panic!("composite URL {template:?}: {e}"))
    }
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
    kv: Opened<dyn KvEngine>,
    large: Option<Opened<dyn LargeEngine>>,
    /// The hooks of the window host when it judges by a clock of its own
    /// (PostgreSQL's `gc_now()`), which is kept stopped at `clock`'s
    /// reading.
    db_clock: Option<Arc<dyn Testing>>,
}

/// The namespace most cases use.
pub fn ns() -> Namespace {
    Namespace::new("contract").expect("valid")
}

/// The namespace `name`, for a test that needs its own (a name shared
/// with a helper binary, or several namespaces side by side).
///
/// # Panics
///
/// If `name` is not a valid namespace: a bug in the test.
pub fn ns_named(name: &str) -> Namespace {
    Namespace::new(name).expect("valid namespace")
}

/// `opened`'s test hooks; the suite needs every engine to have them.
fn hooks<E: ?Sized>(opened: &Opened<E>, what: &str) -> Arc<dyn Testing> {
    opened.testing.clone().unwrap_or_else(|| {
        panic!("the {what} engine has no test hooks (its crate's `testing` feature)")
    })
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
            bucket,
            hook,
        });
        let kv = env
            .resolve(spec.kv, Tier::Kv)
            .open_kv()
            .await
            .expect("open the kv engine");
        let large = match spec.large {
            None => None,
            Some(t) => Some(
                env.resolve(t, Tier::Large)
                    .open_large()
                    .await
                    .expect("open the large engine"),
            ),
        };
        let clock = ManualClock::new(Timestamp(1_000_000));
        Self::build(spec, opts, env, clock, kv, large).await
    }

    async fn build(
        spec: Spec,
        opts: Opts,
        env: Arc<Env>,
        clock: ManualClock,
        kv: Opened<dyn KvEngine>,
        large: Option<Opened<dyn LargeEngine>>,
    ) -> Harness {
        let mut b = Store::builder()
            .mode(spec.mode())
            .window(opts.window)
            .clock(Arc::new(clock.clone()));
        let mut kv_dyn = kv.engine.clone();
        let mut large_dyn = large.as_ref().map(|l| l.engine.clone());
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
        // The window host is the kv engine when it is a seam member, else
        // the large engine when that is one. When it judges by its own
        // clock (PostgreSQL), stop that clock at the injected clock's
        // reading, so the two agree exactly.
        let host = if kv.engine.capabilities().seam.is_some() {
            Some(hooks(&kv, "kv"))
        } else {
            large
                .as_ref()
                .filter(|l| l.engine.capabilities().seam.is_some())
                .map(|l| hooks(l, "large"))
        };
        let db_clock = match host {
            Some(h)
                if h.set_clock(clock.now())
                    .await
                    .expect("set the database clock") =>
            {
                Some(h)
            }
            _ => None,
        };
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
        if let Some(h) = &self.db_clock {
            h.advance_clock(d)
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
        let kv_again = hooks(&kv, "kv").reopen_kv().await;
        let large_again = match &large {
            Some(l) => hooks(l, "large").reopen_large().await,
            None => None,
        };
        drop((kv, large));
        let kv = match kv_again {
            Some(again) => again.expect("reopen the kv engine"),
            None => env
                .resolve(spec.kv, Tier::Kv)
                .open_kv()
                .await
                .expect("reopen the kv engine"),
        };
        let large = match (spec.large, large_again) {
            (None, _) => None,
            (Some(_), Some(again)) => Some(again.expect("reopen the large engine")),
            (Some(t), None) => Some(
                env.resolve(t, Tier::Large)
                    .open_large()
                    .await
                    .expect("reopen the large engine"),
            ),
        };
        Self::build(spec, opts, env, clock, kv, large).await
    }

    /// The kv engine.
    pub fn kv(&self) -> Arc<dyn KvEngine> {
        self.kv.engine.clone()
    }

    /// The kv engine as a plain engine.
    pub fn kv_engine(&self) -> Arc<dyn Engine> {
        self.kv.engine.clone()
    }

    /// The kv engine's named references (`KvEngine::refs`), if it can
    /// hold them.
    pub fn kv_refs(&self) -> Option<Arc<dyn store_types::RefStore>> {
        self.kv.engine.refs()
    }

    /// The kv engine's cache keys (ADR-048), if it holds any.
    pub fn kv_cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        self.kv.engine.cache()
    }

    /// The large engine as a plain engine.
    pub fn large_engine(&self) -> Option<Arc<dyn Engine>> {
        self.large
            .as_ref()
            .map(|l| -> Arc<dyn Engine> { l.engine.clone() })
    }

    /// Whether the instance's window host is durable: some engine is a
    /// seam member with window clauses (a SQL engine), so the window
    /// lives in a table rather than in the process.
    pub fn durable_window(&self) -> bool {
        self.kv
            .engine
            .capabilities()
            .seam
            .into_iter()
            .chain(
                self.large
                    .as_ref()
                    .and_then(|l| l.engine.capabilities().seam),
            )
            .any(|s| s.window.is_some())
    }

    /// Flips a stored byte of `key`, in whichever tier holds it.
    pub async fn corrupt(&self, key: &Key) {
        let hooks = self.tier_hooks(key).await;
        hooks.corrupt_one_byte(key).await.unwrap();
    }

    /// Flips the stored byte at `offset` of `key`, in whichever tier holds
    /// it ([`Testing::corrupt_byte_at`]).
    ///
    /// # Panics
    ///
    /// When that tier's engine has no positioned corruption hook: the
    /// cases that need one run on every composite and must not skip.
    pub async fn corrupt_at(&self, key: &Key, offset: u64) {
        let hooks = self.tier_hooks(key).await;
        hooks
            .corrupt_byte_at(key, offset)
            .await
            .unwrap_or_else(|e| {
                panic!("{}: corrupt_byte_at({key}, {offset}): {e}", self.spec.name)
            });
    }

    async fn tier_hooks(&self, key: &Key) -> Arc<dyn Testing> {
        let stat = self
            .store
            .stat(key)
            .await
            .unwrap()
            .expect("entry to corrupt");
        match (stat.tier, &self.large) {
            (Tier::Kv, _) => hooks(&self.kv, "kv"),
            (Tier::Large, Some(l)) => hooks(l, "large"),
            (tier, None) => panic!("{tier} entry in a store without a large tier"),
        }
    }

    /// Stage files (or stage objects) left in the large tier (0 for
    /// engines without them).
    pub async fn stage_files(&self) -> usize {
        match &self.large {
            Some(l) => hooks(l, "large")
                .stage_files()
                .await
                .expect("count stage files"),
            None => 0,
        }
    }

    /// The PostgreSQL connection details, if any engine uses PostgreSQL.
    pub fn pg(&self) -> Option<&crate::pg::PgSchemas> {
        self.env.pg.as_ref()
    }
}
