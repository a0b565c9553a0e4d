//! Local ends of transfers: the file or stdin a put reads, and the file or
//! stdout a get writes (files are written beside the destination and
//! renamed into place only when the transfer verified).

use std::path::{Path, PathBuf};

use tempfile::TempPath;
use tokio::io::{AsyncRead, AsyncWriteExt};

use crate::output::CliError;

/// Where a put reads from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A file (known length).
    File(PathBuf),
    /// Standard input (unknown length).
    Stdin,
}

impl Source {
    /// `-` is stdin, anything else a path.
    pub fn parse(arg: &str) -> Source {
        if arg == "-" {
            Source::Stdin
        } else {
            Source::File(PathBuf::from(arg))
        }
    }

    /// Opens the source: a reader and its length, if known.
    pub async fn open(&self) -> Result<(Box<dyn AsyncRead + Unpin + Send>, Option<u64>), CliError> {
        match self {
            Source::Stdin => Ok((Box::new(tokio::io::stdin()), None)),
            Source::File(p) => {
                let (f, len) = open_file(p).await?;
                Ok((Box::new(f), Some(len)))
            }
        }
    }
}

/// Opens `path` for reading: the file and its length. Refused (`io`) when
/// it is not a regular file.
pub async fn open_file(path: &Path) -> Result<(tokio::fs::File, u64), CliError> {
    let f = tokio::fs::File::open(path)
        .await
        .map_err(|e| CliError::io(&format!("cannot open {}", path.display()), e))?;
    let meta = f
        .metadata()
        .await
        .map_err(|e| CliError::io(&format!("cannot stat {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(CliError::new(
            "io",
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok((f, meta.len()))
}

/// Where a get writes to.
pub enum Sink {
    /// Standard output (written as it arrives).
    Stdout(tokio::io::Stdout),
    /// A temporary file beside `dest`, renamed onto it by [`Sink::commit`].
    File {
        /// The final path.
        dest: PathBuf,
        /// The temporary file's path: removed when dropped unless persisted.
        tmp: TempPath,
        /// The open temporary file.
        file: tokio::fs::File,
    },
}

/// The directory a get's temporary file is created in: the destination's.
fn parent_dir(dest: &Path) -> &Path {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates the temporary file beside `dest`: a fresh random name opened
/// with `O_CREAT | O_EXCL` (tempfile), so a file or symlink planted under a
/// predictable name is never followed or overwritten. Readable as a file
/// created by `File::create` would be (0666 less the umask).
fn create_temp(dest: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "blob".into());
    let prefix = format!(".{name}.");
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix).suffix(".blobpool-part");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    b.tempfile_in(parent_dir(dest))
}

/// The error of a failed write to the sink: a closed stdout (the reader
/// went away, `blobpool get D | head -c 10`) is [`CliError::stdout_closed`].
fn write_error(to_stdout: bool, e: std::io::Error) -> CliError {
    if to_stdout && e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::stdout_closed()
    } else {
        CliError::io("writing the output", e)
    }
}

impl Sink {
    /// Opens the sink: `None` or `-` is stdout.
    pub async fn open(path: Option<&Path>) -> Result<Sink, CliError> {
        match path {
            None => Ok(Sink::Stdout(tokio::io::stdout())),
            Some(p) if p.as_os_str() == "-" => Ok(Sink::Stdout(tokio::io::stdout())),
            Some(dest) => {
                let dest = dest.to_path_buf();
                let d = dest.clone();
                let tmp = tokio::task::spawn_blocking(move || create_temp(&d))
                    .await
                    .map_err(|e| CliError::new("internal", e.to_string()))?
                    .map_err(|e| {
                        CliError::io(
                            &format!(
                                "cannot create a temporary file in {}",
                                parent_dir(&dest).display()
                            ),
                            e,
                        )
                    })?;
                let (file, tmp) = tmp.into_parts();
                Ok(Sink::File {
                    dest,
                    tmp,
                    file: tokio::fs::File::from_std(file),
                })
            }
        }
    }

    /// Writes all of `chunk`.
    pub async fn write_all(&mut self, chunk: &[u8]) -> Result<(), CliError> {
        match self {
            Sink::Stdout(s) => s.write_all(chunk).await.map_err(|e| write_error(true, e)),
            Sink::File { file, .. } => file
                .write_all(chunk)
                .await
                .map_err(|e| write_error(false, e)),
        }
    }

    /// The destination path (`None` for stdout).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Sink::Stdout(_) => None,
            Sink::File { dest, .. } => Some(dest),
        }
    }

    /// Flushes and, for a file, syncs it and renames it onto the
    /// destination (replacing a file or symlink there, never following
    /// it). On failure the temporary file is removed.
    pub async fn commit(self) -> Result<(), CliError> {
        match self {
            Sink::Stdout(mut s) => s.flush().await.map_err(|e| write_error(true, e)),
            Sink::File {
                dest,
                tmp,
                mut file,
            } => {
                let synced = async {
                    file.flush().await?;
                    file.sync_all().await
                }
                .await;
                drop(file);
                let cannot = |e| CliError::io(&format!("cannot write {}", dest.display()), e);
                // Dropping `tmp` removes the temporary file.
                synced.map_err(cannot)?;
                let d = dest.clone();
                tokio::task::spawn_blocking(move || tmp.persist(&d).map_err(|e| e.error))
                    .await
                    .map_err(|e| CliError::new("internal", e.to_string()))?
                    .map_err(cannot)
            }
        }
    }

    /// Discards a file sink's temporary file (stdout: nothing to undo).
    pub async fn abort(self) {
        if let Sink::File { tmp, file, .. } = self {
            drop(file);
            let _ = tokio::task::spawn_blocking(move || tmp.close()).await;
        }
    }
}
