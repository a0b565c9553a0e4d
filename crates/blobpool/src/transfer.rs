//! Local ends of transfers: the file or stdin a put reads, and the file or
//! stdout a get writes (files are written beside the destination and
//! renamed into place only when the transfer verified).

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

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
                let f = tokio::fs::File::open(p)
                    .await
                    .map_err(|e| CliError::io(&format!("cannot open {}", p.display()), e))?;
                let meta = f
                    .metadata()
                    .await
                    .map_err(|e| CliError::io(&format!("cannot stat {}", p.display()), e))?;
                if !meta.is_file() {
                    return Err(CliError::new(
                        "io",
                        format!("{} is not a regular file", p.display()),
                    ));
                }
                Ok((Box::new(f), Some(meta.len())))
            }
        }
    }
}

/// Where a get writes to.
pub enum Sink {
    /// Standard output (written as it arrives).
    Stdout(tokio::io::Stdout),
    /// A temporary file beside `dest`, renamed onto it by [`Sink::commit`].
    File {
        /// The final path.
        dest: PathBuf,
        /// The temporary path.
        tmp: PathBuf,
        /// The open temporary file.
        file: tokio::fs::File,
    },
}

fn temp_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "blob".into());
    dest.with_file_name(format!(".{name}.blobpool-part-{}", std::process::id()))
}

impl Sink {
    /// Opens the sink: `None` or `-` is stdout.
    pub async fn open(path: Option<&Path>) -> Result<Sink, CliError> {
        match path {
            None => Ok(Sink::Stdout(tokio::io::stdout())),
            Some(p) if p.as_os_str() == "-" => Ok(Sink::Stdout(tokio::io::stdout())),
            Some(dest) => {
                let tmp = temp_path(dest);
                let file = tokio::fs::File::create(&tmp)
                    .await
                    .map_err(|e| CliError::io(&format!("cannot create {}", tmp.display()), e))?;
                Ok(Sink::File {
                    dest: dest.to_path_buf(),
                    tmp,
                    file,
                })
            }
        }
    }

    /// The writer.
    pub fn writer(&mut self) -> &mut (dyn AsyncWrite + Unpin + Send) {
        match self {
            Sink::Stdout(s) => s,
            Sink::File { file, .. } => file,
        }
    }

    /// The destination path (`None` for stdout).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Sink::Stdout(_) => None,
            Sink::File { dest, .. } => Some(dest),
        }
    }

    /// Flushes and, for a file, renames it into place.
    pub async fn commit(self) -> Result<(), CliError> {
        match self {
            Sink::Stdout(mut s) => s.flush().await.map_err(|e| CliError::io("stdout", e)),
            Sink::File {
                dest,
                tmp,
                mut file,
            } => {
                let done = async {
                    file.flush().await?;
                    file.sync_all().await?;
                    drop(file);
                    tokio::fs::rename(&tmp, &dest).await
                }
                .await;
                if let Err(e) = done {
                    let _ = tokio::fs::remove_file(&tmp).await;
                    return Err(CliError::io(&format!("cannot write {}", dest.display()), e));
                }
                Ok(())
            }
        }
    }

    /// Discards a file sink's temporary file.
    pub async fn abort(self) {
        if let Sink::File { tmp, file, .. } = self {
            drop(file);
            let _ = tokio::fs::remove_file(&tmp).await;
        }
    }
}
