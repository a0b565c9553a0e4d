//! The registry's resolution rules (no I/O but the opens at the end).

use super::*;

fn r() -> Registry {
    Registry::default()
}

fn err(e: Error) -> String {
    e.to_string()
}

#[test]
fn every_engine_registers_once_and_usage_lists_them() {
    let names: Vec<&str> = r().factories().iter().map(|f| f.name()).collect();
    let mut want = vec!["mem", "sqlite", "postgres", "local", "pg-lo", "object"];
    if cfg!(feature = "example") {
        want.push("example");
    }
    assert_eq!(names, want);
    let kv_usage = if cfg!(feature = "example") {
        "mem://, sqlite://PATH, postgres://…[?schema=S], or example://"
    } else {
        "mem://, sqlite://PATH, or postgres://…[?schema=S]"
    };
    assert_eq!(r().usage(Tier::Kv), kv_usage);
    assert!(r().usage(Tier::Large).contains("file://PATH"));
}

#[test]
fn a_scheme_registered_twice_is_a_build_mistake() {
    let panic = std::panic::catch_unwind(|| {
        r().register(store_mem::REGISTRATION);
    })
    .expect_err("a second registration of mem:// panics");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("scheme mem:// of mem is taken by mem"),
        "{message}"
    );
}

#[test]
fn urls_resolve_to_their_engines() {
    let o = Options::default();
    for (url, tier, engine, describe) in [
        ("sqlite://./kv.db", Tier::Kv, "sqlite", "sqlite ./kv.db"),
        (
            "postgresql://u:pw@h/db?sslmode=disable&schema=s",
            Tier::Kv,
            "postgres",
            "postgres postgres://u:***@h/db?sslmode=disable (schema s)",
        ),
        ("mem", Tier::Kv, "mem", "mem (in memory, lost on exit)"),
        ("file:///srv/l", Tier::Large, "local", "file /srv/l"),
        (
            "postgres+lo://h/db",
            Tier::Large,
            "pg-lo",
            "pg-lo postgres://h/db (schema blobpool)",
        ),
        ("s3://b/p", Tier::Large, "object", "object s3://b/p"),
        (
            "object+file:///srv/o?part_size=16MiB",
            Tier::Large,
            "object",
            "object file:///srv/o",
        ),
        (
            "gs://bucket/p",
            Tier::Large,
            "object",
            "object gs://bucket/p",
        ),
    ] {
        let spec = r().resolve(url, tier, &o).unwrap();
        assert_eq!(
            (spec.engine(), spec.describe().as_str()),
            (engine, describe),
            "{url}"
        );
    }
    let spec = r()
        .resolve("object+memory://?part_size=1MiB", Tier::Large, &o)
        .unwrap();
    assert_eq!(spec.url().as_str(), "object+memory://");
    assert_eq!(spec.options().params["part_size"], "1MiB");
    assert!(spec.is_private() && !spec.same_store(&spec.clone()));
    let spec = r().resolve("sqlite://x", Tier::Kv, &o).unwrap();
    assert!(spec.same_store(&spec.clone()));
    let unsynced = Options {
        fsync: false,
        ..Options::default()
    };
    assert!(spec.same_store(&r().resolve("sqlite://x", Tier::Kv, &unsynced).unwrap()));
    let pg = |url: &str, schema: &str| {
        let o = Options {
            schema: schema.into(),
            ..Options::default()
        };
        r().resolve(url, Tier::Kv, &o).unwrap()
    };
    assert!(pg("postgres://h/db", "a").same_store(&pg("postgres://h/db?schema=a", "b")));
    assert!(!pg("postgres://h/db", "a").same_store(&pg("postgres://h/db", "b")));
    assert_eq!(r().resolve_large(" none ", &o).unwrap(), None);
}

#[test]
fn bad_urls_are_config_errors_with_passwords_redacted() {
    let o = Options::default();
    let e = err(r().resolve("redis://u:s3cret@h", Tier::Kv, &o).unwrap_err());
    assert!(
        e.starts_with(
            "configuration error: unsupported kv URL \"redis://u:***@h\": expected mem://"
        ),
        "{e}"
    );
    let e = err(r().resolve("file:///x", Tier::Kv, &o).unwrap_err());
    assert!(
        e.contains("is a large engine (local), not a kv engine"),
        "{e}"
    );
    let e = err(r().resolve("sqlite://", Tier::Kv, &o).unwrap_err());
    assert!(e.contains("missing path after sqlite://"), "{e}");
    let e = err(r().resolve("mem://x", Tier::Large, &o).unwrap_err());
    assert!(e.contains("takes no path"), "{e}");
    let e = err(r().resolve("u:s3cret@h", Tier::Kv, &o).unwrap_err());
    assert!(!e.contains("s3cret"), "{e}");
}

#[test]
fn unknown_option_keys_are_rejected_by_name() {
    let o = Options::default().param("durabilty", "normal");
    let e = err(r().resolve("sqlite://x", Tier::Kv, &o).unwrap_err());
    assert!(
        e.contains(
            "unknown option \"durabilty\" for the sqlite engine (it takes durability, readers, cache_bytes)"
        ),
        "{e}"
    );
    let e = err(r()
        .resolve(
            "object+memory://?partsize=1",
            Tier::Large,
            &Options::default(),
        )
        .unwrap_err());
    assert!(
        e.contains("unknown option \"partsize\" for the object engine"),
        "{e}"
    );
    let e = err(r()
        .resolve("mem://", Tier::Kv, &Options::default().param("x", "1"))
        .unwrap_err());
    assert!(e.contains("(it takes none)"), "{e}");
    // aws_ keys go to S3 only.
    let o = Options::default().param("aws_region", "eu-west-1");
    assert!(r().resolve("s3://b", Tier::Large, &o).is_ok());
    assert!(r().resolve("gs://b", Tier::Large, &o).is_err());
    let e = err(r()
        .resolve(
            "sqlite://x",
            Tier::Kv,
            &Options::default().param("durability", "sometimes"),
        )
        .unwrap_err());
    assert!(
        e.contains("sqlite option durability = \"sometimes\": expected full or normal"),
        "{e}"
    );
    let e = err(r()
        .resolve(
            "object+memory://?part_size=1",
            Tier::Large,
            &Options::default().param("part_size", "2"),
        )
        .unwrap_err());
    assert!(e.contains("set both in the URL and in the options"), "{e}");
}

#[tokio::test]
async fn opens_round_trip_through_the_trait_objects() {
    use store_types::{Digest, Key, Namespace, PublishOutcome};
    let dir = tempfile::tempdir().unwrap();
    let o = Options::default();
    let kv = r()
        .open_kv(&format!("sqlite://{}/kv.db", dir.path().display()), &o)
        .await
        .unwrap();
    let key = Key::new(Namespace::new("t").unwrap(), Digest::of(b"x"));
    assert_eq!(
        kv.put(&key, bytes::Bytes::from_static(b"x")).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(kv.capabilities().kind, "sqlite");
    for url in [
        format!("file://{}/large", dir.path().display()),
        format!(
            "object+file://{}/objects?multipart_threshold=8KiB",
            dir.path().display()
        ),
        "mem://".to_string(),
    ] {
        let large = r()
            .open_large(&url, &o)
            .await
            .unwrap()
            .expect("a large tier");
        let mut stage = large.stage(&key.namespace).await.unwrap();
        stage.write(bytes::Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(
            stage.publish(&key).await.unwrap(),
            PublishOutcome::Inserted,
            "{url}"
        );
        assert_eq!(large.meta(&key).await.unwrap().unwrap().size, 1, "{url}");
    }
    assert!(r().open_large("none", &o).await.unwrap().is_none());
    if !cfg!(feature = "gcs") {
        let Err(e) = r().open_large("gs://b/p", &o).await else {
            panic!("gs:// opened without the gcs feature");
        };
        assert!(matches!(e, Error::Config(_)), "{e}");
    }
}
