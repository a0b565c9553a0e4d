//! Helpers for tests (feature `testing`).

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

use store_types::{Error, Key, Result};

use crate::error::{blocking, io_err, is_absent};
use crate::LocalEngine;

impl LocalEngine {
    /// Number of regular files in the stage directory: live stages plus
    /// any orphans not yet swept.
    pub fn stage_file_count(&self) -> std::io::Result<usize> {
        let mut n = 0;
        for entry in fs::read_dir(&self.inner.stage_dir)? {
            if entry?.file_type()?.is_file() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Descriptors the open-file cache holds now (TUNING.md §local-small-reads).
    pub fn open_file_count(&self) -> usize {
        self.inner.open_files.len()
    }

    /// Whether small reads of cached entries may run inline (Linux, local
    /// media, an open-file cache, `RWF_NOWAIT` not refused so far).
    pub fn inline_reads_on(&self) -> bool {
        self.inner
            .inline
            .on
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many reads of a cached descriptor were served inline, and how
    /// many went to the blocking pool because the inline read would have
    /// waited (or was forced to, [`LocalEngine::force_inline_would_block`]).
    pub fn inline_read_counts(&self) -> (u64, u64) {
        let i = &self.inner.inline;
        (
            i.served.load(std::sync::atomic::Ordering::Relaxed),
            i.fell_back.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// How many reads of a descriptor not yet cached were opened and read
    /// inline (`openat2(RESOLVE_CACHED)`, then `RWF_NOWAIT`).
    pub fn inline_open_count(&self) -> u64 {
        self.inner
            .inline
            .opened_inline
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes every inline read attempt behave as if `preadv2` had answered
    /// `EAGAIN` (the bytes not in the page cache), to exercise the
    /// fallback.
    pub fn force_inline_would_block(&self, on: bool) {
        self.inner
            .inline
            .force_would_block
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Removes the outboard kept beside `key`'s entry, as if the entry had
    /// been stored before outboards (ADR-032); fails if there was none.
    pub fn forget_outboard(&self, key: &Key) -> std::io::Result<()> {
        fs::remove_file(crate::outboard_path(&self.inner.content_path(key)))
    }

    /// Damages the stored file of `key` so that reads no longer hash to
    /// its digest: the byte in the middle is bit-flipped in place; an empty
    /// file gets one byte appended instead. The change is fsynced.
    ///
    /// Returns [`Error::Missing`] when `key` is absent.
    pub async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
        let path = self.inner.content_path(key);
        blocking(move || {
            let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) if is_absent(&e) => return Err(Error::Missing),
                Err(e) => return Err(io_err("opening", &path, e)),
            };
            let damage = |file: &mut fs::File| -> std::io::Result<()> {
                let len = file.metadata()?.len();
                if len == 0 {
                    file.write_all(&[0])?;
                } else {
                    let mut byte = [0u8];
                    file.seek(SeekFrom::Start(len / 2))?;
                    file.read_exact(&mut byte)?;
                    byte[0] ^= 0xff;
                    file.seek(SeekFrom::Start(len / 2))?;
                    file.write_all(&byte)?;
                }
                file.sync_all()
            };
            damage(&mut file).map_err(|e| io_err("corrupting", &path, e))
        })
        .await
    }

    /// Flips (`^ 0xff`) the byte at `offset` of `key`'s stored file in
    /// place, size unchanged, and fsyncs.
    ///
    /// Returns [`Error::Missing`] when `key` is absent and an I/O error
    /// when `offset` is not inside the file.
    pub async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
        let path = self.inner.content_path(key);
        blocking(move || {
            let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) if is_absent(&e) => return Err(Error::Missing),
                Err(e) => return Err(io_err("opening", &path, e)),
            };
            let damage = |file: &mut fs::File| -> std::io::Result<()> {
                let mut byte = [0u8];
                file.seek(SeekFrom::Start(offset))?;
                file.read_exact(&mut byte)?;
                byte[0] ^= 0xff;
                file.seek(SeekFrom::Start(offset))?;
                file.write_all(&byte)?;
                file.sync_all()
            };
            damage(&mut file).map_err(|e| io_err("corrupting", &path, e))
        })
        .await
    }
}
