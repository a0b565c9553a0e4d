//! Blobpool's contract suite: cases written once, run against every engine
//! and composite.
//!
//! Each case is a plain async function taking a [`Spec`] (which engines, in
//! which mode). [`contract_suite!`] turns the whole list into separately
//! named tests for one composite, so adding an engine or composite is one
//! line in `tests/contract.rs`:
//!
//! ```text
//! mod sqlite_local { tests_contract::contract_suite!(tests_contract::SQLITE_LOCAL); }
//! ```
//!
//! Cases never skip: where a mode changes the expected behaviour (kv-only
//! rejects what dual-tier stores), the case asserts the behaviour that mode
//! must show. Cases that need what only some kv engines hold — references
//! (`refs_suite!`), cache keys (`cache_suite!`) — are generated only for
//! the composites whose kv engine holds them, and fail anywhere else.

pub mod cases;
pub mod data;
pub mod fleet;
mod harness;
pub mod hook;
pub mod layered;
pub mod pg;
pub mod support;

pub use harness::{ns, ns_named, Harness, ObjectBackend, Opts, Spec, THRESHOLD};

// The composites: engines by registry URL (store-registry; placeholders
// in `harness`). A dual-tier composite may also be written in place, in
// its one line of `tests/contract.rs`:
// `contract_suite!("name", "kv URL", "large URL")`.

/// mem-only: kv=mem, no large tier, any size.
pub const MEM_ONLY: Spec = Spec::kv("mem-only", "mem://", true);
/// kv-only on mem.
pub const KV_MEM: Spec = Spec::kv("kv-only mem", "mem://", false);
/// kv-only on sqlite.
pub const KV_SQLITE: Spec = Spec::kv("kv-only sqlite", "sqlite://{dir}/kv.sqlite", false);
/// dual-tier sqlite + local.
pub const SQLITE_LOCAL: Spec = Spec::dual(
    "sqlite+local",
    "sqlite://{dir}/kv.sqlite",
    "file://{dir}/large",
);
/// dual-tier mem + local (ADR-012 §6.3).
pub const MEM_LOCAL: Spec = Spec::dual("mem+local", "mem://", "file://{dir}/large");
/// dual-tier mem + mem.
pub const MEM_MEM: Spec = Spec::dual("mem+mem", "mem://", "mem://");
/// kv-only on postgres.
pub const KV_POSTGRES: Spec = Spec::kv(
    "kv-only postgres",
    "postgres://{pg}?schema={kv_schema}",
    false,
);
/// dual-tier postgres + pg-lo on the same instance.
pub const POSTGRES_PGLO: Spec = Spec::dual(
    "postgres+pg-lo",
    "postgres://{pg}?schema={kv_schema}",
    "pglo://{pg}?schema={lo_schema}",
);
/// dual-tier postgres + local.
pub const POSTGRES_LOCAL: Spec = Spec::dual(
    "postgres+local",
    "postgres://{pg}?schema={kv_schema}",
    "file://{dir}/large",
);
/// dual-tier sqlite + pg-lo (dual SQL: the window lives on sqlite only).
pub const SQLITE_PGLO: Spec = Spec::dual(
    "sqlite+pg-lo",
    "sqlite://{dir}/kv.sqlite",
    "pglo://{pg}?schema={lo_schema}",
);
/// dual-tier mem + pg-lo (the window lives on pg-lo).
pub const MEM_PGLO: Spec = Spec::dual("mem+pg-lo", "mem://", "pglo://{pg}?schema={lo_schema}");

/// dual-tier sqlite + object store over `InMemory` (a low multipart
/// threshold, so most large-tier blobs go through staging and
/// copy-if-not-exists).
pub const SQLITE_OBJECT_MEM: Spec = Spec::dual(
    "sqlite+object(memory)",
    "sqlite://{dir}/kv.sqlite",
    "object+memory://?multipart_threshold=8KiB&part_size=1MiB",
);
/// dual-tier mem + object store over `LocalFileSystem` (`file://`).
pub const MEM_OBJECT_FS: Spec = Spec::dual(
    "mem+object(file)",
    "mem://",
    "object+file://{dir}/objects?multipart_threshold=8KiB&part_size=1MiB",
);
/// dual-tier postgres + object store over S3 (the moto test server).
pub const POSTGRES_OBJECT_S3: Spec = Spec::dual(
    "postgres+object(s3)",
    "postgres://{pg}?schema={kv_schema}",
    "{s3}/pool?multipart_threshold=8KiB&part_size=5MiB",
);

/// dual-tier sqlite + local, both engines wrapped in the tracing, metrics
/// and (no-fault) fault-injection layers of `store-layers`.
pub const SQLITE_LOCAL_LAYERED: Spec = Spec {
    name: "sqlite+local (layered)",
    layered: true,
    ..SQLITE_LOCAL
};

/// Generates every contract case as a separately named test for one
/// composite.
#[macro_export]
macro_rules! contract_suite {
    // A dual-tier composite in place: name, kv URL, large URL.
    ($name:literal, $kv:literal, $large:literal) => {
        $crate::contract_suite!($crate::Spec::dual($name, $kv, $large));
    };
    ($spec:expr) => {
        $crate::__async_cases!($spec;
            basic::put_get_round_trip,
            basic::threshold_boundaries,
            basic::over_threshold_known_length_rejected_at_once,
            basic::empty_blob,
            basic::dedup,
            basic::namespaces_are_independent,
            basic::missing_entries,
            basic::has_many_index_aligned,
            basic::read_ranges,
            basic::delete_semantics,
            basic::expected_digest,
            basic::put_bytes_matches_put,
            basic::lying_lengths,
            basic::corruption_detected,
            basic::failing_reader_leaves_nothing,
            basic::large_streamed_blob,
            basic::concurrent_identical_puts,
            basic::malformed_keys,
            verified::range_corruption_is_caught_only_in_covering_groups,
            verified::outboards_match_bao_tree,
            verified::small_range_on_corrupt_entry_fails,
            verified::read_answers_size_and_span,
            gc::sweep_without_sources_aborts,
            gc::namespace_without_source_never_swept,
            gc::protect_failure_aborts,
            gc::concurrent_sweep_reports_lock,
            gc::direct_delete_refusals,
            gc::scenario_window_lifecycle,
            gc::scenario_rescues,
            gc::scenario_zero_window,
            gc::window_survives_restart,
            gc::concurrent_puts_and_sweeps,
            gc::cancelled_sweep_keeps_protection,
            gc::cancelled_delete_keeps_protection,
            gc::due_key_busy_under_direct_delete_counted_once,
            gc::vanished_protected_due_key_counts_vanished,
            gc::failure_after_committed_batches_reports_counts,
            seam::one_window_host,
            seam::seam_applicability,
            heal::put_heals_a_corrupt_copy,
            heal::put_during_a_quarantine_is_not_lost,
        );
        #[test]
        fn gc_model() {
            $crate::cases::model::gc_model($spec)
        }
    };
}

/// The engine-level reference cases (`cases/refs.rs`, ADR-024) for a
/// composite whose kv engine holds references; they fail where it holds
/// none. Invoked beside [`contract_suite!`] for every such composite.
#[macro_export]
macro_rules! refs_suite {
    ($spec:expr) => {
        $crate::__async_cases!($spec;
            refs::refs_set_get_delete,
            refs::refs_compare_and_swap,
            refs::refs_delete_with_expectation,
            refs::refs_list_pagination_and_prefixes,
            refs::refs_referenced_many,
            refs::refs_namespaces_stay_marked,
            refs::refs_names_are_opaque,
            refs::refs_concurrent_compare_and_swap,
            refs::refs_a_writer_replaces_only_its_own,
            refs::refs_any_replaces_and_nothing_never_does,
        );
    };
}

/// The cache-key cases (`cases/cache.rs`, ADR-048) for a composite whose
/// kv engine holds cache keys; they fail where it holds none. Invoked
/// beside [`contract_suite!`] for every such composite.
#[macro_export]
macro_rules! cache_suite {
    ($spec:expr) => {
        $crate::__async_cases!($spec;
            cache::cache_record_lookup_remove,
            cache::cache_lookup_many,
            cache::cache_cached_and_usage,
            cache::cache_trim_bytes_least_recent_first,
            cache::cache_trim_age_counts_from_last_access,
            cache::cache_trim_bytes_keeps_no_key_older_than_a_removed_one,
            cache::cache_record_preconditions,
            cache::cache_record_owners,
            cache_receipts::cache_record_refuses_a_receipt_of_another_namespace,
            cache_receipts::cache_sweep_reports_its_trim,
            cache_receipts::cache_bound_holds_at_write_time,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __async_cases {
    ($spec:expr; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::cases::$module::$case($spec).await
            }
        )*
    };
}
