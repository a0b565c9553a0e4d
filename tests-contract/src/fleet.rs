//! Fleet harness: several `fleet: true` store instances over one
//! PostgreSQL schema, with a shared clock, a shared-media directory and an
//! embedder-owned liveness table.
//!
//! Two kinds of clock: the nodes' (a shared [`ManualClock`], or per node a
//! [`SkewedClock`] off it) and the database's (`gc_now()` of the kv
//! schema, which judges pin expiry and the window). [`FleetEnv::new`] stops
//! the database's clock at the shared clock's reading and
//! [`FleetEnv::advance`] moves both alike: time passing. A node's skew is
//! what the database's clock must make irrelevant.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use store_core::{Clock, ManualClock, Mode, Store, StoreBuilder};
use store_local::{LocalEngine, LocalOptions};
use store_object::s3_testing::TestBucket;
use store_pg::testing::{advance_db_clock, set_db_clock};
use store_pglo::PgLoEngine;
use store_postgres::PostgresEngine;
use store_types::{Digest, Key, KvEngine, LargeEngine, LivenessTable, Namespace, Timestamp};

use crate::pg::PgSchemas;
use crate::THRESHOLD;

/// The large tier of a fleet node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetLarge {
    /// kv-only.
    None,
    /// `local` on a directory every node shares, declared shared.
    SharedLocal,
    /// pg-lo in the same database.
    PgLo,
    /// `store-object` on one S3 bucket (the moto test server) every node
    /// reaches through its own client.
    Object,
}

/// One fleet's storage.
pub struct FleetEnv {
    /// The PostgreSQL schemas (dropped with the env).
    pub pg: PgSchemas,
    /// The shared-media directory.
    pub dir: tempfile::TempDir,
    /// The clock every node reads (skewed nodes read it through a
    /// [`SkewedClock`]). Move time with [`FleetEnv::advance`].
    pub clock: ManualClock,
    /// Large tier of every node.
    pub large: FleetLarge,
    /// Delete window of every node.
    pub window: Duration,
    /// Pin TTL of every node.
    pub pin_ttl: Duration,
    /// The bucket of [`FleetLarge::Object`].
    pub bucket: Option<TestBucket>,
    /// A pool for moving the database's clock.
    db: sqlx::PgPool,
}

/// A node clock `skew` off a base clock (ahead when positive): a node whose
/// clock is wrong, moving as time passes.
#[derive(Clone, Debug)]
pub struct SkewedClock {
    /// The clock it is off.
    pub base: ManualClock,
    /// Milliseconds ahead of `base` (behind when negative).
    pub skew_ms: i64,
}

impl SkewedClock {
    /// `base` skewed by `skew_ms`.
    pub fn new(base: ManualClock, skew_ms: i64) -> Self {
        SkewedClock { base, skew_ms }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.base.now().0.saturating_add(self.skew_ms))
    }
}

impl FleetEnv {
    /// Fresh schemas and directory; creates the embedder's reference table
    /// `<kv schema>.refs (ns text, digest bytea)`.
    pub async fn new(large: FleetLarge, window: Duration, pin_ttl: Duration) -> FleetEnv {
        let pg = PgSchemas::create().await;
        let db = sqlx::PgPool::connect(&pg.url)
            .await
            .expect("connect DATABASE_URL");
        let bucket = if large == FleetLarge::Object {
            Some(TestBucket::create().await)
        } else {
            None
        };
        let env = FleetEnv {
            bucket,
            pg,
            dir: tempfile::tempdir().expect("temp dir"),
            clock: ManualClock::new(Timestamp(5_000_000)),
            large,
            window,
            pin_ttl,
            db,
        };
        // The database's clock (the kv schema's `gc_now()`) stands where
        // the nodes' shared clock does, and moves with it (`advance`).
        set_db_clock(&env.db, &env.pg.kv_schema, env.clock.now())
            .await
            .expect("set the database clock");
        let mut c = env.conn().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS \"{s}\";
             CREATE TABLE \"{s}\".refs (ns text NOT NULL, digest bytea NOT NULL)",
            s = env.pg.kv_schema
        )))
        .execute(&mut c)
        .await
        .expect("create refs table");
        env
    }

    /// The shared clock's reading, in ms.
    pub fn clock_now(&self) -> i64 {
        self.clock.now().0
    }

    /// Time passes by `d`: the nodes' shared clock (so every node's, skewed
    /// or not) and the database's clock move alike.
    pub async fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.advance_db_clock(d).await;
    }

    /// Moves only the database's clock (which judges pin expiry and the
    /// window) by `d`, leaving every node's clock where it is.
    pub async fn advance_db_clock(&self, d: Duration) {
        advance_db_clock(&self.db, &self.pg.kv_schema, d)
            .await
            .expect("advance the database clock");
    }

    /// A plain connection to the test database.
    pub async fn conn(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.pg.url)
            .await
            .expect("connect DATABASE_URL")
    }

    /// The kv engine of a new node.
    pub async fn kv(&self) -> PostgresEngine {
        PostgresEngine::connect(&self.pg.url, &self.pg.kv_schema)
            .await
            .expect("open postgres")
    }

    /// The large engine of a new node, if any.
    pub async fn large_engine(&self) -> Option<Arc<dyn LargeEngine>> {
        match self.large {
            FleetLarge::None => None,
            FleetLarge::SharedLocal => Some(Arc::new(
                LocalEngine::open(
                    self.dir.path(),
                    LocalOptions {
                        shared_media: true,
                        fsync: true,
                        ..LocalOptions::default()
                    },
                )
                .await
                .expect("open local"),
            )),
            FleetLarge::PgLo => Some(Arc::new(
                PgLoEngine::connect(&self.pg.url, &self.pg.lo_schema)
                    .await
                    .expect("open pg-lo"),
            )),
            FleetLarge::Object => Some(Arc::new(self.object_engine().await)),
        }
    }

    /// A new node's object engine on the fleet's bucket (its own client).
    pub async fn object_engine(&self) -> store_object::ObjectEngine {
        let bucket = self.bucket.as_ref().expect("an object-store fleet");
        bucket
            .engine("fleet", crate::ObjectBackend::S3.options())
            .await
    }

    /// A builder for a node with the given engines (fleet on).
    pub fn builder(
        &self,
        owner: &str,
        kv: Arc<dyn KvEngine>,
        large: Option<Arc<dyn LargeEngine>>,
    ) -> StoreBuilder {
        let mut b = Store::builder()
            .kv_shared(kv)
            .fleet(true)
            .owner(owner)
            .window(self.window)
            .pin_ttl(self.pin_ttl)
            .clock(Arc::new(self.clock.clone()));
        b = match large {
            Some(l) => b.large_shared(l).mode(Mode::DualTier {
                threshold: THRESHOLD,
            }),
            None => b.mode(Mode::KvOnly {
                threshold: THRESHOLD,
            }),
        };
        b
    }

    /// A new fleet node with the liveness table registered for `ns`.
    pub async fn node(&self, owner: &str, ns: &Namespace) -> Store {
        self.node_with_clock(owner, ns, Arc::new(self.clock.clone()))
            .await
    }

    /// [`FleetEnv::node`] whose GC clock is `clock` instead of the shared
    /// one (a [`SkewedClock`]: a node whose clock is wrong).
    pub async fn node_with_clock(
        &self,
        owner: &str,
        ns: &Namespace,
        clock: Arc<dyn Clock>,
    ) -> Store {
        let kv: Arc<dyn KvEngine> = Arc::new(self.kv().await);
        let store = self
            .builder(owner, kv, self.large_engine().await)
            .clock(clock)
            .build()
            .await
            .expect("build fleet node");
        store
            .gc()
            .register_liveness_source(ns.clone(), self.refs())
            .await
            .expect("register refs table");
        store
    }

    /// The embedder's table as a liveness source.
    pub fn refs(&self) -> LivenessTable {
        LivenessTable::new(&self.pg.kv_schema, "refs", "digest").with_namespace_column("ns")
    }

    /// Records (or removes) a reference in the embedder's table.
    pub async fn set_ref(&self, key: &Key, on: bool) {
        let mut c = self.conn().await;
        let sql = if on {
            "INSERT INTO \"{s}\".refs (ns, digest) VALUES ($1, $2)"
        } else {
            "DELETE FROM \"{s}\".refs WHERE ns = $1 AND digest = $2"
        };
        sqlx::query(sqlx::AssertSqlSafe(sql.replace("{s}", &self.pg.kv_schema)))
            .bind(key.namespace.as_str())
            .bind(key.digest.as_bytes().as_slice())
            .execute(&mut c)
            .await
            .expect("edit refs");
    }

    /// Number of pin rows (expired or not) for `key`.
    pub async fn pin_rows(&self, key: &Key) -> i64 {
        let mut c = self.conn().await;
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".gc_pins WHERE ns = $1 AND digest = $2",
            self.pg.kv_schema
        )))
        .bind(key.namespace.as_str())
        .bind(key.digest.as_bytes().as_slice())
        .fetch_one(&mut c)
        .await
        .expect("count pins")
    }

    /// Makes every insert into `gc_pins` fail (a fault inside the joint
    /// transaction) while `on`.
    pub async fn fail_pin_inserts(&self, on: bool) {
        let mut c = self.conn().await;
        let s = &self.pg.kv_schema;
        let sql = if on {
            format!(
                "CREATE OR REPLACE FUNCTION \"{s}\".fail_pins() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'injected fault inside the pin transaction'; END $$;
                 CREATE TRIGGER fail_pins BEFORE INSERT OR UPDATE ON \"{s}\".gc_pins
                 FOR EACH ROW EXECUTE FUNCTION \"{s}\".fail_pins()"
            )
        } else {
            format!("DROP TRIGGER IF EXISTS fail_pins ON \"{s}\".gc_pins")
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut c)
            .await
            .expect("toggle fault trigger");
    }
}

/// The digest a blob would get.
pub fn digest_of(data: &[u8]) -> Digest {
    Digest::of(data)
}
