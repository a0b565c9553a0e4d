//! What the real-build-tool tests (`build_cache_clients.rs`,
//! `build_cache_bazel_gradle.rs`) share: a `blobpool serve` child with
//! cache namespaces and keys, its metrics, and running the tools.

use std::path::Path;
use std::process::{Command, Output};

use super::ServeChild;

/// `blobpool serve` in `dir` on an ephemeral loopback port (data in
/// `dir/data`) with the cache namespaces `caches` (a name and its bound,
/// a TOML line such as `max_bytes = "1GiB"`), the `anonymous` scopes (a
/// TOML array's items), a key `builder` (`key`: read, write) and a key
/// `monitor` (`admin_key`: admin). The child and its base URL.
pub fn serve(
    dir: &Path,
    caches: &[(&str, &str)],
    anonymous: &str,
    key: &str,
    admin_key: &str,
) -> (ServeChild, String) {
    let mut config = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\n",
        dir.join("data")
    );
    for (ns, bound) in caches {
        config += &format!("[gc.namespaces.{ns}]\npolicy = \"cache\"\n{bound}\n");
    }
    config += &format!(
        "[auth]\nanonymous = [{anonymous}]\n\
         [[auth.keys]]\nname = \"builder\"\nhash = \"{}\"\nscopes = [\"read\", \"write\"]\n\
         [[auth.keys]]\nname = \"monitor\"\nhash = \"{}\"\nscopes = [\"admin\"]\n",
        store_ops::auth::hash_key(key),
        store_ops::auth::hash_key(admin_key)
    );
    super::serve_child_with_config(dir, &config)
}

/// `GET /metrics` with `admin_key`, asserting a 200; the whole answer.
pub fn metrics(base: &str, admin_key: &str) -> String {
    let answer = super::plain_get(base, "/metrics", Some(admin_key));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
}

/// Runs `c`, failing the test (with both streams) on a non-zero exit.
pub fn run(c: &mut Command) -> Output {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
