//! The file-system seam: every call that changes what a crash would leave
//! on disk — creating a file or directory, linking, renaming, unlinking,
//! writing, and the durability points (`fdatasync` of a file, `fsync` of a
//! directory) — goes through a [`Seam`].
//!
//! Without the `crash-model` feature a seam is an empty struct and each
//! method is the plain `std::fs` call. With it, an engine opened by
//! `LocalEngine::open_with_crash_model` carries the model
//! ([`crate::crash::CrashModel`]): durability points are reported to the
//! shared [`store_types::crash::CrashSwitch`] and recorded in the model's
//! durable image, and once the modelled process has crashed every call
//! here fails (the process is dead) and changes nothing. See
//! ADR-029 ("Local files").

use std::fs::{self, File};
use std::io;
use std::path::Path;

/// The file-system calls that matter to a crash (see the module docs).
///
/// Cloning is cheap (at most an `Arc` and an epoch).
#[derive(Clone, Default)]
pub(crate) struct Seam {
    #[cfg(feature = "crash-model")]
    model: Option<crate::crash::Attached>,
}

impl Seam {
    /// A seam reporting to an attached crash model.
    #[cfg(feature = "crash-model")]
    pub(crate) fn with_model(model: crate::crash::Attached) -> Self {
        Seam { model: Some(model) }
    }

    /// Fails once the modelled process has crashed.
    #[inline]
    pub(crate) fn alive(&self) -> io::Result<()> {
        #[cfg(feature = "crash-model")]
        if let Some(m) = &self.model {
            m.alive()?;
        }
        Ok(())
    }

    /// `File::create_new` (a write-only descriptor on a new inode).
    pub(crate) fn create_new(&self, path: &Path) -> io::Result<File> {
        self.alive()?;
        let file = File::create_new(path)?;
        #[cfg(feature = "crash-model")]
        if let Some(m) = &self.model {
            m.created(&file)?;
        }
        Ok(file)
    }

    /// `fs::create_dir_all`.
    pub(crate) fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        fs::create_dir_all(dir)
    }

    /// `fs::hard_link` (never replaces `to`).
    pub(crate) fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.alive()?;
        fs::hard_link(from, to)
    }

    /// `fs::rename` (replaces `to`).
    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.alive()?;
        fs::rename(from, to)
    }

    /// `fs::remove_file`.
    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.alive()?;
        fs::remove_file(path)
    }

    /// `fdatasync` of `file` (whose name is `path`): its bytes are durable
    /// once this returns. A durability point.
    pub(crate) fn sync_data(
        &self,
        file: &File,
        path: &Path,
        label: &'static str,
    ) -> io::Result<()> {
        #[cfg(feature = "crash-model")]
        if let Some(m) = &self.model {
            let durable = m.file_point(label, file, path)?;
            file.sync_data()?;
            m.commit_file(durable);
            return Ok(());
        }
        let _ = (path, label);
        file.sync_data()
    }

    /// `fsync` of the directory `dir`: the names created and removed in it
    /// are durable once this returns. A durability point. A no-op where
    /// directories cannot be opened (non-Unix).
    pub(crate) fn sync_dir(&self, dir: &Path, label: &'static str) -> io::Result<()> {
        #[cfg(feature = "crash-model")]
        if let Some(m) = &self.model {
            let durable = m.dir_point(label, dir)?;
            sync_dir(dir)?;
            m.commit_dir(durable);
            return Ok(());
        }
        let _ = label;
        sync_dir(dir)
    }
}

/// The real directory fsync.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|d| d.sync_all())
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
