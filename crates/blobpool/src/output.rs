//! Command results, their text and JSON renderings, and the CLI error.

use std::fmt;

use serde::Serialize;
use store_ops::{ErrorCode, OpsError, StatResponse};
use store_types::{Report, Tier};

/// A failed command: a stable code (the server's error codes, plus `usage`,
/// `config` and `http`), a one-line message and the chain of causes behind
/// it (printed as `caused by: …` lines, see [`CliError::render`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    /// Stable code.
    pub code: String,
    /// One-line message.
    pub message: String,
    /// The causes, nearest first, one line each.
    pub causes: Vec<String>,
}

impl CliError {
    /// An error with `code`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        CliError {
            code: code.into(),
            message: one_line(&message.into()),
            causes: Vec::new(),
        }
    }

    /// Records the causes of `e` (not `e` itself) as this error's chain.
    pub(crate) fn caused_by(mut self, e: &(dyn std::error::Error + 'static)) -> Self {
        self.causes = Report::new(e)
            .causes()
            .map(|c| one_line(&c.to_string()))
            .collect();
        self
    }

    /// The failure as printed on standard error: `blobpool: code: message`,
    /// then one `  caused by: …` line per cause.
    pub fn render(&self) -> String {
        let mut out = format!("blobpool: {self}");
        for c in &self.causes {
            out.push_str("\n  caused by: ");
            out.push_str(c);
        }
        out
    }

    /// A configuration error.
    pub fn config(message: impl std::fmt::Display) -> Self {
        CliError::new("config", message.to_string())
    }

    /// A local I/O failure: `what` failed, caused by `e`.
    pub fn io(what: &str, e: std::io::Error) -> Self {
        let mut out = CliError::new("io", what).caused_by(&e);
        out.causes.insert(0, one_line(&e.to_string()));
        out
    }

    /// A usage error (bad flags or arguments): exit status 2.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::new(USAGE, message)
    }

    /// Standard output was closed by its reader (`| head`): the command
    /// ends quietly with status 0.
    pub fn stdout_closed() -> Self {
        CliError::new(STDOUT_CLOSED, "standard output was closed")
    }

    /// Whether this is [`CliError::stdout_closed`].
    pub fn is_stdout_closed(&self) -> bool {
        self.code == STDOUT_CLOSED
    }

    /// Whether this is a usage error (exit status 2).
    pub fn is_usage(&self) -> bool {
        self.code == USAGE
    }
}

/// The code of a usage error.
const USAGE: &str = "usage";
/// The (never printed) code of a closed standard output.
const STDOUT_CLOSED: &str = "stdout_closed";

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl From<OpsError> for CliError {
    fn from(e: OpsError) -> Self {
        CliError::new(e.code.as_str(), e.message)
    }
}

impl From<store_types::Error> for CliError {
    /// The code of the ops layer's mapping (or `config`, `locked`), the
    /// error's own one-line message, and its cause chain.
    fn from(e: store_types::Error) -> Self {
        let out = match &e {
            store_types::Error::Config(m) => CliError::config(m.clone()),
            // `serve` (or any command) on data another instance holds.
            store_types::Error::InstanceLocked { .. } => CliError::new("locked", e.to_string()),
            _ => CliError::new(OpsError::from(e.clone()).code.as_str(), e.to_string()),
        };
        out.caused_by(&e)
    }
}

/// The code of an absent entry.
pub fn missing(what: impl fmt::Display) -> CliError {
    CliError::new(
        ErrorCode::Missing.as_str(),
        format!("no such entry: {what}"),
    )
}

/// `put`'s result.
#[derive(Debug, Serialize)]
pub struct PutResult {
    /// Namespace.
    pub namespace: String,
    /// Canonical digest.
    pub digest: String,
    /// Size (direct mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Tier (direct mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// Whether the entry existed (direct mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deduplicated: Option<bool>,
    /// The server's pin token (server mode, unless released).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `true` when the pin token was released (server mode, `--release`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
}

/// `get`'s result (printed only with `-o`).
#[derive(Debug, Serialize)]
pub struct GetResult {
    /// Namespace.
    pub namespace: String,
    /// Digest.
    pub digest: String,
    /// Bytes written.
    pub size: u64,
    /// Output path (absent for stdout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `has`'s result.
#[derive(Debug, Serialize)]
pub struct HasResult {
    /// Namespace.
    pub namespace: String,
    /// The digests asked about.
    pub digests: Vec<String>,
    /// Index-aligned presence.
    pub present: Vec<bool>,
}

/// `rm`'s result.
#[derive(Debug, Serialize)]
pub struct RmResult {
    /// Namespace.
    pub namespace: String,
    /// Digest.
    pub digest: String,
    /// Always `true` (failures are errors).
    pub deleted: bool,
}

/// Prints a result on stdout as JSON or with `text` (nothing for an empty
/// text). A closed stdout is [`CliError::stdout_closed`].
pub fn emit<T: Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<(), CliError> {
    let line = if json {
        serde_json::to_string(value).expect("results serialize")
    } else {
        text(value)
    };
    if line.is_empty() {
        return Ok(());
    }
    print_stdout(&line)
}

/// Writes `line` and a newline on stdout and flushes.
pub fn print_stdout(line: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                CliError::stdout_closed()
            } else {
                CliError::io("writing to stdout", e)
            }
        })
}

/// `stat`'s text form.
pub fn stat_text(s: &StatResponse) -> String {
    format!(
        "namespace\t{}\ndigest\t{}\nsize\t{}\ntier\t{}\ncreated_at\t{}",
        s.namespace, s.digest, s.size, s.tier, s.created_at
    )
}

/// `sweep`'s text form.
pub fn sweep_text(r: &store_core::SweepReport) -> String {
    let mut out = String::new();
    if let Some(cause) = r.aborted {
        let cause = serde_json::to_value(cause)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{cause:?}"));
        out.push_str(&format!("aborted\t{cause}\n"));
    }
    let t = &r.total;
    out.push_str(&format!(
        "scanned\t{}\nprotected\t{}\nstaged\t{}\ndeleted\t{}\nrescued\t{}\nvanished\t{}\nbytes_freed\t{}",
        t.scanned,
        t.protected.total(),
        t.staged,
        t.deleted,
        t.rescued,
        t.vanished,
        t.bytes_freed
    ));
    if !r.unswept_namespaces.is_empty() {
        let names: Vec<&str> = r.unswept_namespaces.iter().map(|n| n.as_str()).collect();
        out.push_str(&format!("\nunswept\t{}", names.join(",")));
    }
    for (ns, t) in &r.cache_trims {
        out.push_str(&format!(
            "\ncache_trim\t{ns}\t{} keys\t{} bytes",
            t.keys, t.bytes
        ));
    }
    out
}
