//! `blobpool`: the Blobpool server and command line.
//!
//! `blobpool serve` runs the HTTP server (docs/SERVER.md) over the
//! configured store; `put`, `get`, `stat`, `has`, `rm` and `sweep` work
//! either directly on the configured store or, with `--server URL`, against
//! a running server. Exit status: 0 on success, 1 on a failed command (one
//! line on stderr: `blobpool: <code>: <message>`), 2 on a usage error.
//!
//! Direct mode opens the store as a non-fleet instance, which holds its
//! data exclusively (the instance lock, docs/ARCHITECTURE.md): while
//! `blobpool serve` (or any other non-fleet store) has the same data open,
//! a direct command fails with code `locked`, naming the holder and
//! suggesting `--server` — a second instance could not see the server's
//! pins and would sweep or delete entries it still protects.

mod config;
mod direct;
mod output;
mod progress;
mod remote;
mod serve;
mod transfer;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use store_types::{Digest, Key, Namespace};

use crate::config::Config;
use crate::direct::Direct;
use crate::output::{emit, stat_text, sweep_text, CliError, RmResult};
use crate::remote::Remote;
use crate::transfer::{Sink, Source};

const AFTER_HELP: &str = "\
Configuration: --config FILE (default ./blobpool.toml when present), then
BLOBPOOL_* environment variables (BLOBPOOL_KV, BLOBPOOL_LARGE, BLOBPOOL_MODE,
BLOBPOOL_THRESHOLD, BLOBPOOL_FLEET, BLOBPOOL_WINDOW, BLOBPOOL_PIN_TTL, ...).
Without any, the store is SQLite + local files under ./blobpool-data.

Examples:
  blobpool serve                              # http://127.0.0.1:7070
  blobpool put photo.jpg                      # prints the digest
  blobpool get <digest> -o copy.jpg
  tar c dir | blobpool --server http://127.0.0.1:7070 put -n backups -
  blobpool has <digest> <digest> --json";

/// Blobpool: a content-addressed blob store.
#[derive(Debug, Parser)]
#[command(name = "blobpool", version, about, after_help = AFTER_HELP)]
struct Cli {
    /// TOML config file [default: ./blobpool.toml if present].
    #[arg(long, global = true, env = "BLOBPOOL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Talk to a running server (e.g. http://127.0.0.1:7070) instead of
    /// opening the store directly.
    #[arg(long, global = true, env = "BLOBPOOL_SERVER", value_name = "URL")]
    server: Option<String>,

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
        /// Listen address [default: 127.0.0.1:7070, or `listen` in the config].
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Store a file (or stdin with `-`); prints its digest.
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
    Config::load(cli.config.as_deref(), &|k| std::env::var(k).ok()).map_err(CliError::config)
}

async fn target(cli: &Cli) -> Result<Target, CliError> {
    let progress = !cli.quiet;
    match &cli.server {
        Some(url) => Ok(Target::Remote(Remote::new(url, progress)?)),
        None => {
            let cfg = load_config(cli)?;
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
        Command::Serve { listen } => {
            if cli.server.is_some() {
                return Err(CliError::new("usage", "serve does not take --server"));
            }
            let mut cfg = load_config(&cli)?;
            if let Some(l) = listen {
                cfg.listen = l.clone();
            }
            serve::run(cfg).await
        }
        Command::Put {
            file,
            ns,
            expect,
            release,
        } => {
            let ns = parse_ns(&ns.namespace)?;
            let expect = expect.as_deref().map(parse_digest).transpose()?;
            let src = Source::parse(file);
            let r = match target(&cli).await? {
                Target::Direct(d) => d.put(&ns, &src, expect).await?,
                Target::Remote(r) => r.put(&ns, &src, expect, *release).await?,
            };
            emit(json, &r, |r| r.digest.clone());
            Ok(())
        }
        Command::Get { digest, ns, output } => {
            let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
            let t = target(&cli).await?;
            let sink = Sink::open(output.as_deref()).await?;
            let to_stdout = sink.path().is_none();
            let r = match t {
                Target::Direct(d) => d.get(&key, sink).await?,
                Target::Remote(r) => r.get(&key, sink).await?,
            };
            if !to_stdout {
                emit(json, &r, |_| String::new());
            }
            Ok(())
        }
        Command::Stat { digest, ns } => {
            let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
            let s = match target(&cli).await? {
                Target::Direct(d) => d.stat(&key).await?,
                Target::Remote(r) => r.stat(&key).await?,
            };
            emit(json, &s, stat_text);
            Ok(())
        }
        Command::Has { digests, ns } => {
            let ns = parse_ns(&ns.namespace)?;
            let digests = digests
                .iter()
                .map(|d| parse_digest(d))
                .collect::<Result<Vec<_>, _>>()?;
            let r = match target(&cli).await? {
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
            });
            Ok(())
        }
        Command::Rm { digest, ns } => {
            let key = Key::new(parse_ns(&ns.namespace)?, parse_digest(digest)?);
            match target(&cli).await? {
                Target::Direct(d) => d.rm(&key).await?,
                Target::Remote(r) => r.rm(&key).await?,
            }
            let r = RmResult {
                namespace: key.namespace.to_string(),
                digest: key.digest.to_hex(),
                deleted: true,
            };
            emit(json, &r, |r| format!("deleted {}", r.digest));
            Ok(())
        }
        Command::Sweep => {
            let report = match target(&cli).await? {
                Target::Direct(d) => d.sweep().await?,
                Target::Remote(r) => r.sweep().await?,
            };
            emit(json, &report, sweep_text);
            Ok(())
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
        Err(e) => {
            eprintln!("blobpool: {e}");
            ExitCode::from(1)
        }
    }
}
