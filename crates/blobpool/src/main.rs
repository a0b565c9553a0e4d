//! `blobpool`: the Blobpool server and command line.
//!
//! `blobpool serve` runs the HTTP server (docs/SERVER.md) over the
//! configured store; `put`, `get`, `stat`, `has`, `rm` and `sweep` work
//! either directly on the configured store or, with `--server URL`, against
//! a running server. Exit status: 0 on success, 1 on a failed command (one
//! line on stderr: `blobpool: <code>: <message>`), 2 on a usage error
//! (clap's, or one line `blobpool: usage: <message>`). A closed standard
//! output (`blobpool get D | head -c 10`) ends the command quietly with 0.
//!
//! Over `--server`, `--token` authenticates (a bearer API key; refused over
//! plain `http://` to a host that is not loopback unless
//! `--allow-insecure-http`), `--ca-cert` adds a trusted root for
//! `https://`, `--client-cert`/`--client-key` present a client certificate,
//! and `--connect-timeout`/`--timeout` bound connecting and each read.
//! `blobpool key new` mints an API key and the server-config snippet for
//! it.
//!
//! Direct mode opens the store as a non-fleet instance, which holds its
//! data exclusively (the instance lock, docs/ARCHITECTURE.md): while
//! `blobpool serve` (or any other non-fleet store) has the same data open,
//! a direct command fails with code `locked`, naming the holder and
//! suggesting `--server` — a second instance could not see the server's
//! pins and would sweep or delete entries it still protects.

// config, gc and security live in the library target (src/lib.rs) so the
// fuzz targets can parse configurations; the binary uses them from there.
use blobpool::error::Invalid;
use blobpool::{config, gc, security};
mod copy;
mod direct;
mod inspect;
mod output;
mod progress;
mod refcmd;
mod remote;
mod serve;
mod transfer;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use store_types::{Digest, Key, Namespace};

use crate::config::{Config, LogFormat};
use crate::direct::Direct;
use crate::output::{emit, stat_text, sweep_text, CliError, RmResult};
use crate::remote::{Remote, RemoteOpts};
use crate::transfer::{Sink, Source};

const AFTER_HELP: &str = "\
Configuration: --config FILE (default ./blobpool.toml when present), then
BLOBPOOL_* environment variables (BLOBPOOL_KV, BLOBPOOL_LARGE, BLOBPOOL_MODE,
BLOBPOOL_THRESHOLD, BLOBPOOL_FLEET, BLOBPOOL_WINDOW, BLOBPOOL_PIN_TTL, ...),
then flags. Durations: seconds or 90s, 15m, 1h; sizes: bytes or 64KiB, 4GiB.
Without any, the store is SQLite + local files under ./blobpool-data
(--data-dir DIR, BLOBPOOL_DATA_DIR or data_dir to move it).

Examples:
  blobpool serve                              # http://127.0.0.1:7070
  blobpool put photo.jpg                      # prints the digest
  blobpool get <digest> -o copy.jpg
  tar c dir | blobpool --server http://127.0.0.1:7070 put -n backups -
  blobpool has <digest> <digest> --json
  BLOBPOOL_TOKEN=bpk_... blobpool --server https://pool.example:7070 get <digest>
  blobpool key new --name ci --scope read --scope 'write:ci-*'";

/// Blobpool: a content-addressed blob store.
#[derive(Debug, Parser)]
#[command(name = "blobpool", version = env!("BUILD_VERSION"), about, after_help = AFTER_HELP)]
struct Cli {
    /// TOML config file [default: ./blobpool.toml if present].
    #[arg(long, global = true, env = "BLOBPOOL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Root of the default store (DIR/kv.sqlite and DIR/large) instead of
    /// ./blobpool-data [env: BLOBPOOL_DATA_DIR, config: data_dir]; an
    /// error when `kv` is set.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// Talk to a running server (e.g. http://127.0.0.1:7070) instead of
    /// opening the store directly.
    #[arg(long, global = true, env = "BLOBPOOL_SERVER", value_name = "URL")]
    server: Option<String>,

    /// API key for the server, sent as `Authorization: Bearer KEY` (see
    /// `blobpool key new`). Only over https:// or to a loopback address,
    /// unless --allow-insecure-http.
    #[arg(
        long,
        global = true,
        env = "BLOBPOOL_TOKEN",
        hide_env_values = true,
        value_name = "KEY"
    )]
    token: Option<String>,

    /// Allow sending --token over plain http:// to a host that is not
    /// loopback (only on a network you trust: anyone on the path can read
    /// it).
    #[arg(long, global = true)]
    allow_insecure_http: bool,

    /// PEM file of root certificates to trust for https:// in addition to
    /// the system's (e.g. a self-signed server's certificate or its CA).
    #[arg(long, global = true, env = "BLOBPOOL_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,

    /// PEM client certificate (chain) to present to the server (mutual
    /// TLS); needs --client-key.
    #[arg(
        long,
        global = true,
        env = "BLOBPOOL_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    client_cert: Option<PathBuf>,

    /// PEM private key of --client-cert.
    #[arg(
        long,
        global = true,
        env = "BLOBPOOL_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    client_key: Option<PathBuf>,

    /// How long to wait for a connection to the server (e.g. 10s, 2m, or
    /// plain seconds; 0: no limit).
    #[arg(
        long,
        global = true,
        env = "BLOBPOOL_CONNECT_TIMEOUT",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_duration
    )]
    connect_timeout: TimeLimit,

    /// How long the server may stay silent during a request: an idle
    /// timeout, not a deadline, so long transfers that keep moving are
    /// never cut (e.g. 60s, 5m, or plain seconds; 0: no limit). A sweep
    /// is waited for however long it runs.
    #[arg(
        long,
        global = true,
        env = "BLOBPOOL_TIMEOUT",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = parse_duration
    )]
    timeout: TimeLimit,

    /// Print results as JSON (one object per line).
    #[arg(long, global = true)]
    json: bool,

    /// No progress bars.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct NsArg {
    /// Namespace: 1-64 chars of [a-z0-9._-], starting with [a-z0-9].
    #[arg(
        long,
        short = 'n',
        default_value = "default",
        env = "BLOBPOOL_NAMESPACE"
    )]
    namespace: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server over the configured store until Ctrl-C/SIGTERM
    /// (in-flight requests finish first).
    Serve {
        /// Serve a non-loopback address without any API key, client
        /// certificate or anonymous grant configured: everyone gets every
        /// scope. Only on a network you trust (overrides the config's
        /// `insecure_no_auth`).
        #[arg(long)]
        insecure_no_auth: bool,
        /// Log format on stderr: text or json [default: `log_format` in the
        /// config, else text].
        #[arg(long, value_name = "FORMAT", value_parser = parse_log_format)]
        log_format: Option<LogFormat>,
        #[command(flatten)]
        store: config::StoreFlags,
    },
    /// Store a file (or stdin with `-`); prints its digest.
    ///
    /// With --server, the server pins the new entry with a pin token so a
    /// sweep cannot delete it before something references it. The token
    /// is never dropped silently: in text mode stdout is still just the
    /// digest and a note on stderr shows the token and how to release it
    /// (`blobpool --server URL release TOKEN`); with --json the object
    /// carries `"token"`. With --release the token is released at once
    /// (stderr says so; --json has `"released": true`). If the command
    /// fails after the server stored the blob, the token is released
    /// before exiting.
    ///
    /// With --server, a file of 8 MiB or more is hashed first and sent
    /// through a resumable upload session in 8 MiB chunks: a dropped
    /// connection or a server restart is retried (pausing 0.5 s, doubling
    /// to 8 s, up to 8 times in a row) from the offset the server
    /// committed. A server without upload sessions gets the plain put.
    Put {
        /// The file to store, or `-` for stdin.
        #[arg(value_name = "FILE|-")]
        file: String,
        #[command(flatten)]
        ns: NsArg,
        /// Fail (storing nothing) unless the content hashes to this digest.
        #[arg(long, value_name = "DIGEST")]
        expect: Option<String>,
        /// Server mode: release the pin token right away instead of printing
        /// it (the entry is then protected only by references).
        #[arg(long)]
        release: bool,
        /// Also point this reference at the entry (set under the put's pin,
        /// then the pin is released): the entry is kept while the reference
        /// exists.
        #[arg(long = "ref", value_name = "NAME", conflicts_with = "release")]
        ref_name: Option<String>,
    },
    /// Write a blob's verified content to a file or stdout.
    Get {
        /// The blob's digest (64 lowercase hex characters).
        digest: String,
        #[command(flatten)]
        ns: NsArg,
        /// Output file [default: stdout]. Written only if the content
        /// verifies.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        /// Only bytes START through END (inclusive, as HTTP's `Range`),
        /// verified by 16 KiB chunk group against the digest before they
        /// are written (with --server: a bao stream).
        #[arg(long, value_name = "START-END", value_parser = parse_range)]
        range: Option<std::ops::Range<u64>>,
    },
    /// Show a blob's size, tier and creation time.
    Stat {
        /// The blob's digest.
        digest: String,
        #[command(flatten)]
        ns: NsArg,
    },
    /// Tell which digests are stored.
    Has {
        /// Digests to look up.
        #[arg(required = true)]
        digests: Vec<String>,
        #[command(flatten)]
        ns: NsArg,
    },
    /// Release pin tokens a server holds (from `put --server`); needs
    /// --server.
    Release {
        /// The tokens.
        #[arg(required = true, value_name = "TOKEN")]
        tokens: Vec<String>,
    },
    /// Delete a blob (refused while it is pinned or referenced).
    Rm {
        /// The blob's digest.
        digest: String,
        #[command(flatten)]
        ns: NsArg,
    },
    /// Run one garbage-collection sweep and print its report. Only
    /// namespaces with a liveness source are swept (see
    /// `gc.unreferenced_namespaces`); with none at all, the sweep reports
    /// `no_liveness_sources` and deletes nothing.
    Sweep,
    /// API keys for the server's `[[auth.keys]]` (ADR-023).
    #[command(subcommand)]
    Key(KeyCommand),
    /// List the namespaces, or a namespace's entries (digest, size, tier,
    /// creation time) in digest order.
    Ls(inspect::LsArgs),
    /// Entries and bytes (and pinned and staged entries) per namespace and
    /// tier.
    Du(inspect::DuArgs),
    /// Re-hash stored entries through the verified read path, online and
    /// rate-limited; report ok, corrupt and missing entries (exit 1 when
    /// one is corrupt), optionally quarantining corrupt ones.
    Verify(inspect::VerifyArgs),
    /// Named references: `ref set NAME DIGEST`, `ref get NAME`, `ref rm
    /// NAME`, `ref ls` (a referenced entry is never garbage).
    Ref(refcmd::RefArgs),
    /// Copy entries from one store configuration to another (e.g. SQLite +
    /// local files to PostgreSQL + pg-lo, or to S3): streaming, verified,
    /// idempotent and resumable (entries the destination has are skipped).
    #[command(after_help = copy::AFTER_HELP)]
    Copy {
        /// Source config file (read without BLOBPOOL_* overrides).
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
        /// Destination config file (read without BLOBPOOL_* overrides).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
        /// Copy only this namespace (repeatable) [default: all]; with
        /// --digests, the namespace of bare digests [default: default].
        #[arg(long = "namespace", short = 'n', value_name = "NS")]
        namespaces: Vec<String>,
        /// Copy only the entries listed in FILE (`-`: stdin): one digest or
        /// `NAMESPACE DIGEST` per line.
        #[arg(long, value_name = "FILE|-")]
        digests: Option<String>,
        /// Entries copied concurrently.
        #[arg(long, default_value_t = copy::DEFAULT_JOBS,
              value_parser = clap::value_parser!(u16).range(1..=256))]
        jobs: u16,
        /// Copy entries only, no named references.
        #[arg(long)]
        no_refs: bool,
        /// A destination reference pointing at another digest takes the
        /// source's (else it is a failure).
        #[arg(long, conflicts_with = "no_refs")]
        overwrite_refs: bool,
    },
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Print a fresh API key and the `[[auth.keys]]` entry for the server's
    /// config (the server stores only the key's hash). Give the key to
    /// the client (--token / BLOBPOOL_TOKEN); it is shown only once.
    New {
        /// The key's name in the server's config and logs [default:
        /// key-<first 8 hex of its hash>].
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// A grant: read, write, delete or admin, optionally followed by
        /// :NAMESPACE_PATTERN (a glob with `*`, e.g. write:ci-*);
        /// repeatable [default: read].
        #[arg(long, value_name = "SCOPE")]
        scope: Vec<String>,
    },
    /// Read a key on stdin and print its `hash = "blake3:..."` line for the
    /// server's config.
    Hash,
}

fn parse_log_format(s: &str) -> Result<LogFormat, Invalid> {
    s.parse()
}

/// A timeout flag's value (`None`: no limit).
#[derive(Clone, Copy, Debug)]
struct TimeLimit(Option<Duration>);

/// A duration flag: plain seconds or a number with `ms`, `s`, `m` or `h`;
/// `0` means no limit.
fn parse_duration(s: &str) -> Result<TimeLimit, Invalid> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 10s, 2m, 500ms, or plain seconds)"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" | "secs" => n,
        "ms" => n / 1000.0,
        "m" | "min" | "mins" => n * 60.0,
        "h" => n * 3600.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use ms, s, m or h)").into()),
    };
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("{s:?} is too long").into());
    }
    Ok(TimeLimit(
        (secs > 0.0).then(|| Duration::from_secs_f64(secs)),
    ))
}

enum Target {
    Direct(Direct),
    Remote(Remote),
}

fn parse_ns(s: &str) -> Result<Namespace, CliError> {
    Ok(Namespace::new(s)?)
}

fn parse_digest(s: &str) -> Result<Digest, CliError> {
    Ok(Digest::parse(s)?)
}

fn load_config(cli: &Cli) -> Result<Config, CliError> {
    load_config_with(cli, None)
}

/// The configuration under `serve`'s store flags and the global
/// `--data-dir`.
fn load_config_with(cli: &Cli, store: Option<&config::StoreFlags>) -> Result<Config, CliError> {
    let mut flags = store.cloned().unwrap_or_default();
    flags.data_dir = cli.data_dir.as_ref().map(|d| d.display().to_string());
    config::check_environment(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
        .map_err(CliError::config)?;
    Config::load_with(cli.config.as_deref(), &|k| std::env::var(k).ok(), &flags)
        .map_err(CliError::config)
}

fn remote_opts(cli: &Cli) -> RemoteOpts {
    RemoteOpts {
        // An empty BLOBPOOL_TOKEN= means none.
        token: cli
            .token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string),
        allow_insecure_http: cli.allow_insecure_http,
        ca_cert: cli.ca_cert.clone(),
        client_cert: cli.client_cert.clone(),
        client_key: cli.client_key.clone(),
        connect_timeout: cli.connect_timeout.0,
        read_timeout: cli.timeout.0,
    }
}

fn remote(cli: &Cli, url: &str) -> Result<Remote, CliError> {
    Remote::new(url, &remote_opts(cli), !cli.quiet)
}

async fn target(cli: &Cli) -> Result<Target, CliError> {
    let progress = !cli.quiet;
    match &cli.server {
        Some(url) => Ok(Target::Remote(remote(cli, url)?)),
        None => {
            let cfg = load_config(cli)?;
            // The store's shape, for a person at a terminal (like the
            // progress bars; scripts see only their results).
            if progress && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                eprintln!("blobpool: {}", cfg.describe());
            }
            let store = cfg
                .open_store()
                .await
                .map_err(|e| direct::open_error(e, &cfg.listen))?;
            Ok(Target::Direct(Direct::new(store, progress)))
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let json = cli.json;
    match &cli.command {
        Command::Serve {
            insecure_no_auth,
            log_format,
            store,
        } => serve_command(&cli, *insecure_no_auth, *log_format, store).await,
        Command::Put {
            file,
            ns,
            expect,
            release,
            ref_name,
        } => {
            put_command(
                &cli,
                file,
                ns,
                expect.as_deref(),
                *release,
                ref_name.as_deref(),
            )
            .await
        }
        Command::Release { tokens } => release_command(&cli, tokens).await,
        Command::Key(k) => key_command(k, json),
        Command::Ref(a) => ref_command(&cli, a).await,
        Command::Ls(a) => inspect::ls(&cli, a).await,
        Command::Du(a) => inspect::du(&cli, a).await,
        Command::Verify(a) => inspect::verify(&cli, a).await,
        Command::Copy {
            from,
            to,
            namespaces,
            digests,
            jobs,
            no_refs,
            overwrite_refs,
        } => {
            if cli.server.is_some() {
                return Err(CliError::usage(
                    "copy does not take --server: it opens --from and --to directly",
                ));
            }
            let opts = copy::CopyOpts {
                from: from.clone(),
                to: to.clone(),
                selection: copy::selection(namespaces, digests.as_deref())?,
                jobs: usize::from(*jobs),
                progress: !cli.quiet,
                refs: !*no_refs,
                overwrite_refs: *overwrite_refs,
            };
            copy::run(opts, json).await
        }
        Command::Get {
            digest,
            ns,
            output,
            range,
        } => get_command(&cli, digest, ns, output.as_deref(), range.clone()).await,
        Command::Stat { digest, ns } => stat_command(&cli, digest, ns).await,
        Command::Has { digests, ns } => has_command(&cli, digests, ns).await,
        Command::Rm { digest, ns } => rm_command(&cli, digest, ns).await,
        Command::Sweep => sweep_command(&cli).await,
    }
}

/// `serve`: the configuration with the command's own flags over it.
async fn serve_command(
    cli: &Cli,
    insecure_no_auth: bool,
    log_format: Option<LogFormat>,
    store: &config::StoreFlags,
) -> Result<(), CliError> {
    if cli.server.is_some() {
        return Err(CliError::usage("serve does not take --server"));
    }
    let mut cfg = load_config_with(cli, Some(store))?;
    if insecure_no_auth {
        cfg.insecure_no_auth = true;
    }
    if let Some(f) = log_format {
        cfg.log_format = f;
    }
    serve::run(cfg).await
}

/// `put`, with `--ref` or without.
async fn put_command(
    cli: &Cli,
    file: &str,
    ns: &NsArg,
    expect: Option<&str>,
    release: bool,
    ref_name: Option<&str>,
) -> Result<(), CliError> {
    let json = cli.json;
    let ns = parse_ns(&ns.namespace)?;
    let expect = expect.map(parse_digest).transpose()?;
    let src = Source::parse(file);
    if let Some(name) = ref_name {
        let r = match target(cli).await? {
            Target::Direct(d) => {
                refcmd::direct_put_with_ref(&d, &ns, &src, expect, name, !cli.quiet).await?
            }
            Target::Remote(remote) => {
                refcmd::remote_put_with_ref(&remote, &ns, &src, expect, name).await?
            }
        };
        return emit(json, &r, |r| r.digest.clone());
    }
    match target(cli).await? {
        Target::Direct(d) => {
            let r = d.put(&ns, &src, expect).await?;
            emit(json, &r, |r| r.digest.clone())
        }
        Target::Remote(remote) => {
            let r = remote.put(&ns, &src, expect, release).await?;
            report_remote_put(&remote, json, &r).await
        }
    }
}

/// `release`: each token, on the server.
async fn release_command(cli: &Cli, tokens: &[String]) -> Result<(), CliError> {
    let json = cli.json;
    let Some(url) = &cli.server else {
        return Err(CliError::usage(
            "release needs --server URL: pin tokens are held by a server",
        ));
    };
    let remote = remote(cli, url)?;
    for token in tokens {
        remote.release(token).await?;
        emit(
            json,
            &serde_json::json!({ "token": token, "released": true }),
            |_| format!("released {token}"),
        )?;
    }
    Ok(())
}

/// `get`, whole or a range, to a file or stdout.
async fn get_command(
    cli: &Cli,
    digest: &str,
    ns: &NsArg,
    output: Option<&std::path::Path>,
    range: Option<std::ops::Range<u64>>,
) -> Result<(), CliError> {
    let json = cli.json;
    let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
    let t = target(cli).await?;
    let sink = Sink::open(output).await?;
    let to_stdout = sink.path().is_none();
    let r = match (t, range) {
        (Target::Direct(d), None) => d.get(&key, sink).await?,
        (Target::Direct(d), Some(r)) => d.get_range(&key, r, sink).await?,
        (Target::Remote(r), None) => r.get(&key, sink).await?,
        (Target::Remote(r), Some(range)) => r.get_range(&key, range, sink).await?,
    };
    if !to_stdout {
        emit(json, &r, |_| String::new())?;
    }
    Ok(())
}

/// `stat`: one entry's metadata.
async fn stat_command(cli: &Cli, digest: &str, ns: &NsArg) -> Result<(), CliError> {
    let json = cli.json;
    let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
    let s = match target(cli).await? {
        Target::Direct(d) => d.stat(&key).await?,
        Target::Remote(r) => r.stat(&key).await?,
    };
    emit(json, &s, stat_text)
}

/// `has`: which of the digests are present.
async fn has_command(cli: &Cli, digests: &[String], ns: &NsArg) -> Result<(), CliError> {
    let json = cli.json;
    let ns = parse_ns(&ns.namespace)?;
    let digests = digests
        .iter()
        .map(|d| parse_digest(d))
        .collect::<Result<Vec<_>, _>>()?;
    let r = match target(cli).await? {
        Target::Direct(d) => d.has(&ns, &digests).await?,
        Target::Remote(r) => r.has(&ns, &digests).await?,
    };
    emit(json, &r, |r| {
        r.digests
            .iter()
            .zip(&r.present)
            .map(|(d, p)| format!("{d}\t{}", if *p { "present" } else { "absent" }))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// `rm`: a direct delete.
async fn rm_command(cli: &Cli, digest: &str, ns: &NsArg) -> Result<(), CliError> {
    let json = cli.json;
    let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
    match target(cli).await? {
        Target::Direct(d) => d.rm(&key).await?,
        Target::Remote(r) => r.rm(&key).await?,
    }
    let r = RmResult {
        namespace: key.namespace.to_string(),
        digest: key.digest.to_hex(),
        deleted: true,
    };
    emit(json, &r, |r| format!("deleted {}", r.digest))
}

/// `ref`: a reference command, direct or on the server.
async fn ref_command(cli: &Cli, a: &refcmd::RefArgs) -> Result<(), CliError> {
    match target(cli).await? {
        Target::Direct(d) => refcmd::run(Some(&d), None, &a.command, cli.json).await,
        Target::Remote(r) => refcmd::run(None, Some(&r), &a.command, cli.json).await,
    }
}

/// `sweep`: one GC pass, direct or on the server.
async fn sweep_command(cli: &Cli) -> Result<(), CliError> {
    let report = match target(cli).await? {
        Target::Direct(d) => d.sweep().await?,
        Target::Remote(r) => r.sweep().await?,
    };
    emit(cli.json, &report, sweep_text)
}

/// Prints a remote put's result (see `put`'s help). If printing fails, the
/// pin token (which nobody saw) is released before the error is returned.
async fn report_remote_put(
    remote: &Remote,
    json: bool,
    r: &output::PutResult,
) -> Result<(), CliError> {
    if let Err(e) = emit(json, r, |r| r.digest.clone()) {
        if let Some(token) = &r.token {
            if let Err(re) = remote.release(token).await {
                return Err(CliError::new(
                    e.code.clone(),
                    format!(
                        "{}; stored {} but could not release its pin token {token} ({re})",
                        e.message, r.digest
                    ),
                ));
            }
        }
        return Err(e);
    }
    if !json {
        match &r.token {
            Some(token) => eprintln!(
                "blobpool: pin token {token} holds this entry (sweeps keep it); release it \
                 with `blobpool --server {} release {token}` once it is referenced, \
                 or put with --release",
                remote.base
            ),
            None => {
                eprintln!("blobpool: pin token released: only references protect this entry now")
            }
        }
    }
    Ok(())
}

/// `blobpool key new` / `key hash`.
fn key_command(k: &KeyCommand, json: bool) -> Result<(), CliError> {
    use store_ops::auth::{generate_key, hash_key, Grant};
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    match k {
        KeyCommand::New { name, scope } => {
            let scopes = if scope.is_empty() {
                vec!["read".to_string()]
            } else {
                scope
                    .iter()
                    .map(|s| Grant::parse(s).map(|g| g.to_string()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| CliError::usage(format!("--scope {e}")))?
            };
            let key = generate_key();
            let hash = hash_key(&key);
            let name = match name {
                Some(n) if n.trim().is_empty() => {
                    return Err(CliError::usage("--name must not be empty"))
                }
                Some(n) => n.clone(),
                None => {
                    let hex = hash.strip_prefix("blake3:").unwrap_or(&hash);
                    format!("key-{}", &hex[..8.min(hex.len())])
                }
            };
            emit(
                json,
                &serde_json::json!({
                    "key": key, "name": name, "hash": hash, "scopes": scopes,
                }),
                |_| {
                    let list: Vec<String> = scopes.iter().map(|s| quote(s)).collect();
                    format!(
                        "key: {key}\n[[auth.keys]]\nname = {}\nhash = {}\nscopes = [{}]",
                        quote(&name),
                        quote(&hash),
                        list.join(", ")
                    )
                },
            )
        }
        KeyCommand::Hash => {
            let mut input = String::new();
            std::io::stdin()
                .take(64 * 1024)
                .read_to_string(&mut input)
                .map_err(|e| CliError::io("reading the key from stdin", e))?;
            let key = input.trim();
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(CliError::usage(
                    "key hash reads one key (e.g. bpk_...) on stdin",
                ));
            }
            let hash = hash_key(key);
            emit(json, &serde_json::json!({ "hash": hash }), |_| {
                format!("hash = {}", quote(&hash))
            })
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("blobpool: internal: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`| head`): not a failure.
        Err(e) if e.is_stdout_closed() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", e.render());
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

/// `--range START-END` (inclusive) as `START..END+1`.
fn parse_range(s: &str) -> Result<std::ops::Range<u64>, Invalid> {
    let bad = || format!("{s:?} is not START-END (inclusive byte offsets, START <= END)");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a > b || b == u64::MAX {
        return Err(bad().into());
    }
    Ok(a..b + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Every `BLOBPOOL_*` variable a flag reads is known to
    /// `check_environment` (which would refuse it otherwise), and
    /// `CLI_VARIABLES` lists no variable that no flag reads.
    #[test]
    fn the_flags_variables_are_the_known_command_line_ones() {
        use clap::CommandFactory;
        fn walk(c: &clap::Command, into: &mut Vec<String>) {
            for a in c.get_arguments() {
                if let Some(e) = a.get_env() {
                    into.push(e.to_string_lossy().into_owned());
                }
            }
            for sub in c.get_subcommands() {
                walk(sub, into);
            }
        }
        let mut read = Vec::new();
        walk(&Cli::command(), &mut read);
        read.sort();
        read.dedup();
        let mut listed: Vec<String> = config::CLI_VARIABLES
            .iter()
            .map(|s| s.to_string())
            .collect();
        listed.sort();
        assert_eq!(read, listed);
    }

    #[test]
    fn durations_parse() {
        let d = |s: &str| parse_duration(s).map(|t| t.0);
        assert_eq!(d("10"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(d("10s"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(d("2m"), Ok(Some(Duration::from_secs(120))));
        assert_eq!(d("1h"), Ok(Some(Duration::from_secs(3600))));
        assert_eq!(d("250ms"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(d("1.5s"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(d("0"), Ok(None));
        for bad in ["", "s", "soon", "5y", "-1", "1e400"] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }
}
