//! The crash model of the local engine (feature `crash-model`, Unix only;
//! issue 14, ADR-029 "Local files").
//!
//! A [`CrashModel`] watches one engine's root through the file-system seam
//! and keeps the **durable image**: what a machine crash right now would
//! leave on disk, under POSIX's guarantees and nothing more.
//!
//! - The image starts as the root as it is when the engine is opened with
//!   the model ([`crate::LocalEngine::open_with_crash_model`]): what was
//!   there before is taken to be durable.
//! - A file's **bytes** become durable when it is `fdatasync`ed: the model
//!   reads the file at that moment and keeps those bytes for its inode.
//!   Bytes written later are volatile.
//! - A directory's **names** (files created, hard-linked, renamed in or
//!   out, unlinked; subdirectories made) become durable when the directory
//!   is fsynced: the model keeps its listing at that moment. A directory
//!   never fsynced since the model started keeps the listing it had then
//!   (empty for one made since); one whose own name is not durable in its
//!   parent vanishes with everything in it.
//! - Every durability point is first reported to the shared
//!   [`CrashSwitch`]; the point the switch crashes at, and everything after
//!   it, changes nothing: every later seam call fails, as the process is
//!   dead.
//!
//! [`CrashModel::crash_and_restore`] then rebuilds the root from the image:
//! each durable name with its inode's durable bytes (names sharing an
//! inode stay hard links). A file holding more bytes than were synced loses
//! its unsynced tail — truncated, or (with a seed) also zero-filled,
//! filled with garbage, or kept in part, as real file systems do. The
//! engine is then opened again on that root.
//!
//! Not modelled: reordering or tearing *within* an fsync interval beyond
//! the tail (a write that overwrote synced bytes is lost whole), the
//! stronger ordering journaling file systems give (ext4 commits a new
//! file's name with its data), metadata other than names and bytes
//! (modes, times, sizes of directories), and files outside the root.
//! Files a test creates behind the engine's back while it runs (planted
//! orphans, junk) are known by inode number only: should one reuse the
//! number of a file the engine created and removed, the model takes it
//! for that file.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use store_types::crash::{CrashSwitch, Crashed};

/// A file's identity across renames and links: its inode number and the
/// model's generation of that number (inode numbers are reused).
pub(crate) type FileId = (u64, u64);

/// One durable directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    File(FileId),
    Dir,
    Symlink(PathBuf),
}

/// A directory's durable listing.
pub(crate) type Listing = BTreeMap<OsString, Node>;

/// The crash model of one local engine root (see the module docs).
///
/// Cloning shares the model. One model watches one root at a time.
#[derive(Clone)]
pub struct CrashModel {
    inner: Arc<Model>,
}

struct Model {
    switch: CrashSwitch,
    /// Seeds how lost tails are restored; `None`: always truncated.
    seed: Option<u64>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The directory to watch, if not the engine's root
    /// ([`CrashModel::watching`]).
    requested: Option<PathBuf>,
    /// The canonical watched directory while attached.
    root: Option<PathBuf>,
    /// Bumped by every attach and every crash: seams of an older epoch
    /// belong to a dead process and refuse everything.
    epoch: u64,
    /// Current generation of each inode number created through the seam.
    gens: HashMap<u64, u64>,
    next_gen: u64,
    /// Durable bytes of each file.
    data: HashMap<FileId, Vec<u8>>,
    /// Durable listing of each directory, by path relative to the root.
    dirs: HashMap<PathBuf, Listing>,
    /// Restores done so far (varies the seeded tails between lives).
    restores: u64,
    /// Numbers the snapshots durability points take, in the order taken.
    snapshots: u64,
    /// The snapshot each file's durable bytes and each directory's durable
    /// listing come from: two syncs of one file or directory may run
    /// concurrently and finish in either order, and the later snapshot
    /// (which saw more) must win whichever commits last.
    committed: HashMap<Committed, u64>,
}

/// What a snapshot was taken of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Committed {
    File(FileId),
    Dir(PathBuf),
}

/// What [`CrashModel::crash_and_restore`] rebuilt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Regular files written back (each hard link counted once).
    pub files: usize,
    /// Directories written back (the root not counted).
    pub dirs: usize,
    /// Files that held bytes never synced, which were lost or damaged.
    pub torn_tails: usize,
    /// Names on disk at the crash that the image does not have (created
    /// or linked without a directory fsync since).
    pub names_dropped: usize,
    /// Names in the image that were gone from disk at the crash (unlinked
    /// or renamed away without a directory fsync since).
    pub names_restored: usize,
}

/// What a crash does to a file's unsynced tail.
#[derive(Clone, Copy, Debug)]
enum Tail {
    Truncate,
    Zeros,
    Garbage,
    /// Part of the tail reached the disk.
    Prefix,
}

impl CrashModel {
    /// A model reporting to `switch`; lost tails are always truncated.
    pub fn new(switch: CrashSwitch) -> Self {
        Self::build(switch, None)
    }

    /// A model reporting to `switch` that restores each lost tail, chosen
    /// by `seed`, as truncated, zero-filled, garbage or partly kept.
    pub fn with_seed(switch: CrashSwitch, seed: u64) -> Self {
        Self::build(switch, Some(seed))
    }

    fn build(switch: CrashSwitch, seed: Option<u64>) -> Self {
        CrashModel {
            inner: Arc::new(Model {
                switch,
                seed,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Watches `dir`, which must exist and hold the engine's root (at any
    /// depth, existing or not), instead of the root itself: the creation
    /// of the root and of its missing parents is then part of the image.
    /// Everything under `dir` is rebuilt by a restore — give a directory
    /// of the test's own.
    pub fn watching(self, dir: impl Into<PathBuf>) -> Self {
        self.state().requested = Some(dir.into());
        self
    }

    /// The directory the model watches for an engine rooted at `root`: the
    /// one given to [`CrashModel::watching`], else the root (created if
    /// needed), canonical.
    pub(crate) fn watched_dir(&self, root: &Path) -> io::Result<PathBuf> {
        let requested = self.state().requested.clone();
        match requested {
            Some(dir) => {
                let dir = dir.canonicalize()?;
                let abs = std::path::absolute(root)?;
                if !abs.starts_with(&dir) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "crash model: root {} is not under the watched {}",
                            abs.display(),
                            dir.display()
                        ),
                    ));
                }
                Ok(dir)
            }
            None => {
                fs::create_dir_all(root)?;
                root.canonicalize()
            }
        }
    }

    /// The switch the model reports durability points to.
    pub fn switch(&self) -> &CrashSwitch {
        &self.inner.switch
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching the canonical directory `root`: its present content
    /// is the durable image. Any engine attached before is dead from now
    /// on.
    pub(crate) fn attach(&self, root: &Path) -> io::Result<Attached> {
        let mut st = self.state();
        st.epoch += 1;
        st.root = Some(root.to_path_buf());
        st.data.clear();
        st.dirs.clear();
        st.gens.clear();
        st.committed.clear();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = root.join(&rel);
            let listing = list(&dir, &st.gens)?;
            for (name, node) in &listing {
                match node {
                    Node::Dir => stack.push(rel.join(name)),
                    Node::File(id) => {
                        let bytes = fs::read(dir.join(name))?;
                        st.data.insert(*id, bytes);
                    }
                    Node::Symlink(_) => {}
                }
            }
            st.dirs.insert(rel, listing);
        }
        Ok(Attached {
            model: self.clone(),
            epoch: st.epoch,
        })
    }

    /// Crashes the machine now (unless the switch already has), then
    /// replaces the root's content by the durable image (see the module
    /// docs). Every engine attached to this model is dead afterwards:
    /// drop it, [`CrashSwitch::reset`] the switch (once every model on it
    /// is restored) and open the engine again on the root.
    ///
    /// Blocking file-system work; returns the watched directory (the
    /// engine's root unless [`CrashModel::watching`]) and what was rebuilt.
    pub fn crash_and_restore(&self) -> io::Result<(PathBuf, RestoreReport)> {
        self.inner.switch.crash_now();
        let mut st = self.state();
        st.epoch += 1;
        st.restores += 1;
        let root = st.root.take().ok_or_else(|| {
            io::Error::other("crash model: no engine attached, nothing to restore")
        })?;
        let mut rng = self
            .inner
            .seed
            .map(|s| SplitMix(s ^ st.restores.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let mut report = RestoreReport::default();

        // What is on disk at the crash: every name, and the bytes of each
        // inode (the source of unsynced tails).
        let mut on_disk = HashMap::new();
        let mut live_names = Vec::new();
        walk(&root, Path::new(""), &mut |rel, meta| {
            live_names.push(rel.to_path_buf());
            if meta.is_file() {
                on_disk.entry(meta.ino()).or_insert_with(|| root.join(rel));
            }
        })?;

        // The image, in creation order (parents first).
        let mut plan: Vec<(PathBuf, Planned)> = Vec::new();
        let mut first_name: HashMap<FileId, PathBuf> = HashMap::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let Some(listing) = st.dirs.get(&rel) else {
                continue; // Made since the model started, never fsynced.
            };
            for (name, node) in listing {
                let path = rel.join(name);
                match node {
                    Node::Dir => {
                        plan.push((path.clone(), Planned::Dir));
                        stack.push(path);
                    }
                    Node::Symlink(target) => plan.push((path, Planned::Symlink(target.clone()))),
                    Node::File(id) => {
                        if let Some(first) = first_name.get(id) {
                            plan.push((path, Planned::Link(first.clone())));
                            continue;
                        }
                        first_name.insert(*id, path.clone());
                        let durable = st.data.get(id).cloned().unwrap_or_default();
                        let current = (st.gens.get(&id.0).copied().unwrap_or(0) == id.1)
                            .then(|| on_disk.get(&id.0))
                            .flatten()
                            .map(fs::read)
                            .transpose()?;
                        let (bytes, torn) = restore_bytes(durable, current, rng.as_mut());
                        report.torn_tails += usize::from(torn);
                        plan.push((path, Planned::File(bytes)));
                    }
                }
            }
        }
        let image: std::collections::HashSet<&Path> =
            plan.iter().map(|(p, _)| p.as_path()).collect();
        report.names_dropped = live_names
            .iter()
            .filter(|n| !image.contains(n.as_path()))
            .count();
        let live: std::collections::HashSet<&Path> =
            live_names.iter().map(PathBuf::as_path).collect();
        report.names_restored = image.iter().filter(|p| !live.contains(*p)).count();

        write_image(&root, plan, &mut report)?;
        st.data.clear();
        st.dirs.clear();
        st.gens.clear();
        st.committed.clear();
        Ok((root, report))
    }
}

/// Replaces everything under `root` by the durable image `plan` (in
/// creation order), counting what it writes into `report`.
fn write_image(
    root: &Path,
    plan: Vec<(PathBuf, Planned)>,
    report: &mut RestoreReport,
) -> io::Result<()> {
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    for (rel, planned) in plan {
        let path = root.join(&rel);
        match planned {
            Planned::Dir => {
                fs::create_dir(&path)?;
                report.dirs += 1;
            }
            Planned::File(bytes) => {
                fs::write(&path, bytes)?;
                report.files += 1;
            }
            Planned::Link(first) => fs::hard_link(root.join(first), &path)?,
            Planned::Symlink(target) => std::os::unix::fs::symlink(target, &path)?,
        }
    }
    Ok(())
}

/// One entry of the rebuilt image.
enum Planned {
    Dir,
    File(Vec<u8>),
    /// A further name of the file first written at this path.
    Link(PathBuf),
    Symlink(PathBuf),
}

/// The bytes a crash leaves of a file whose durable bytes are `durable`
/// and which held `current` at the crash (if still on disk); whether
/// unsynced bytes were lost or damaged.
fn restore_bytes(
    durable: Vec<u8>,
    current: Option<Vec<u8>>,
    rng: Option<&mut SplitMix>,
) -> (Vec<u8>, bool) {
    let Some(current) = current else {
        return (durable, false);
    };
    if current == durable {
        return (durable, false);
    }
    if current.len() <= durable.len() {
        // Rewritten in place (or shortened) since the sync: the rewrite is
        // lost whole.
        return (durable, true);
    }
    let tail = &current[durable.len()..];
    let mode = match rng {
        None => (Tail::Truncate, 0),
        Some(rng) => {
            let pick = rng.next();
            let mode = match pick % 4 {
                0 => Tail::Truncate,
                1 => Tail::Zeros,
                2 => Tail::Garbage,
                _ => Tail::Prefix,
            };
            (mode, rng.next())
        }
    };
    let mut out = durable;
    match mode {
        (Tail::Truncate, _) => {}
        (Tail::Zeros, _) => out.resize(current.len(), 0),
        (Tail::Garbage, mut x) => out.extend(tail.iter().map(|b| {
            x = x.rotate_left(7) ^ 0x5555;
            b ^ (x as u8 | 1)
        })),
        (Tail::Prefix, x) => {
            let keep = (x % tail.len() as u64) as usize; // Never all of it.
            out.extend_from_slice(&tail[..keep]);
        }
    }
    (out, true)
}

/// A small reproducible generator (SplitMix64): the same seed restores
/// the same tails on every platform and toolchain.
struct SplitMix(u64);

impl State {
    /// Whether `snapshot` is later than the committed one of `what`; if
    /// so, it becomes the committed one.
    fn newer(&mut self, what: Committed, snapshot: u64) -> bool {
        let last = self.committed.entry(what).or_insert(0);
        if snapshot > *last {
            *last = snapshot;
            true
        } else {
            false
        }
    }
}

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The listing of `dir` as the model records it.
fn list(dir: &Path, gens: &HashMap<u64, u64>) -> io::Result<Listing> {
    let mut out = Listing::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = fs::symlink_metadata(entry.path())?;
        let node = if meta.is_dir() {
            Node::Dir
        } else if meta.file_type().is_symlink() {
            Node::Symlink(fs::read_link(entry.path())?)
        } else if meta.is_file() {
            Node::File((meta.ino(), gens.get(&meta.ino()).copied().unwrap_or(0)))
        } else {
            continue; // Sockets, fifos: the engine never makes them.
        };
        out.insert(entry.file_name(), node);
    }
    Ok(out)
}

/// Calls `f` with every name under `root` (relative) and its metadata.
fn walk(root: &Path, rel: &Path, f: &mut dyn FnMut(&Path, &fs::Metadata)) -> io::Result<()> {
    for entry in fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        let meta = fs::symlink_metadata(entry.path())?;
        f(&rel, &meta);
        if meta.is_dir() {
            walk(root, &rel, f)?;
        }
    }
    Ok(())
}

/// A model as one engine's seam sees it: the epoch it was attached in.
#[derive(Clone)]
pub(crate) struct Attached {
    model: CrashModel,
    epoch: u64,
}

/// A durability point's record, committed once the real sync succeeded.
pub(crate) struct Pending<T> {
    epoch: u64,
    /// The snapshot's number ([`State::snapshots`]).
    snapshot: u64,
    record: Option<T>,
}

impl Attached {
    fn crashed(&self) -> io::Error {
        io::Error::other(Crashed {
            at: self.model.inner.switch.points(),
        })
    }

    /// Fails once the process this seam belongs to has crashed.
    pub(crate) fn alive(&self) -> io::Result<()> {
        if self.model.inner.switch.crashed() || self.model.state().epoch != self.epoch {
            return Err(self.crashed());
        }
        Ok(())
    }

    /// Reports a durability point to the switch.
    fn point(&self, label: &'static str) -> io::Result<()> {
        self.alive()?;
        self.model
            .inner
            .switch
            .point(label)
            .map_err(io::Error::other)
    }

    /// Records that `file` was created (a new generation of its inode).
    pub(crate) fn created(&self, file: &File) -> io::Result<()> {
        let ino = file.metadata()?.ino();
        let mut st = self.model.state();
        st.next_gen += 1;
        let generation = st.next_gen;
        st.gens.insert(ino, generation);
        Ok(())
    }

    /// The durability point of an `fdatasync` of `file`, named `path`: its
    /// bytes now, to be committed once the sync succeeded. A file whose
    /// name no longer leads to it (removed by a concurrent sweep) records
    /// nothing.
    pub(crate) fn file_point(
        &self,
        label: &'static str,
        file: &File,
        path: &Path,
    ) -> io::Result<Pending<(FileId, Vec<u8>)>> {
        self.point(label)?;
        let ino = file.metadata()?.ino();
        // Under the state lock, so snapshots are numbered in the order they
        // read the disk.
        let mut st = self.model.state();
        let named = fs::metadata(path).is_ok_and(|m| m.ino() == ino);
        let record = if named {
            let generation = st.gens.get(&ino).copied().unwrap_or(0);
            Some(((ino, generation), fs::read(path)?))
        } else {
            None
        };
        st.snapshots += 1;
        Ok(Pending {
            epoch: self.epoch,
            snapshot: st.snapshots,
            record,
        })
    }

    /// Makes a file sync's record durable, unless a later snapshot of the
    /// file already was.
    pub(crate) fn commit_file(&self, pending: Pending<(FileId, Vec<u8>)>) {
        let mut st = self.model.state();
        if let (true, Some((id, bytes))) = (st.epoch == pending.epoch, pending.record) {
            if st.newer(Committed::File(id), pending.snapshot) {
                st.data.insert(id, bytes);
            }
        }
    }

    /// The durability point of an fsync of the directory `dir`: its
    /// listing now, if it is under the root.
    pub(crate) fn dir_point(
        &self,
        label: &'static str,
        dir: &Path,
    ) -> io::Result<Pending<(PathBuf, Listing)>> {
        self.point(label)?;
        let mut st = self.model.state();
        let rel = st
            .root
            .as_ref()
            .and_then(|root| dir.strip_prefix(root).ok())
            .map(Path::to_path_buf);
        let record = match rel {
            Some(rel) => Some((rel, list(dir, &st.gens)?)),
            None => None, // Above the root: not part of the image.
        };
        st.snapshots += 1;
        Ok(Pending {
            epoch: self.epoch,
            snapshot: st.snapshots,
            record,
        })
    }

    /// Makes a directory sync's record durable, unless a later snapshot of
    /// the directory already was.
    pub(crate) fn commit_dir(&self, pending: Pending<(PathBuf, Listing)>) {
        let mut st = self.model.state();
        if let (true, Some((rel, listing))) = (st.epoch == pending.epoch, pending.record) {
            if st.newer(Committed::Dir(rel.clone()), pending.snapshot) {
                st.dirs.insert(rel, listing);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::seam::Seam;

    /// A seam attached to a fresh model on a fresh root.
    fn setup(seed: Option<u64>) -> (tempfile::TempDir, CrashModel, Seam) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let model = CrashModel::build(CrashSwitch::new(), seed);
        let seam = Seam::with_model(model.attach(&root).unwrap());
        (dir, model, seam)
    }

    fn write_file(seam: &Seam, path: &Path, bytes: &[u8]) -> File {
        let mut f = seam.create_new(path).unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    /// Two syncs of one directory (or file) run concurrently by two
    /// publishes can finish in either order; the one that saw more must
    /// stay durable. (Found by the facade's crash test: concurrent large
    /// puts into one fan-out directory, one put's acknowledged name lost.)
    #[test]
    fn concurrent_syncs_committed_out_of_order_keep_the_later_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let model = CrashModel::build(CrashSwitch::new(), None);
        let att = model.attach(&root).unwrap();
        let create = |name: &str, bytes: &[u8]| {
            let path = root.join(name);
            let mut f = File::create_new(&path).unwrap();
            att.created(&f).unwrap();
            f.write_all(bytes).unwrap();
            (f, path)
        };
        let (mut a, a_path) = create("a", b"x");
        let first_a = att.file_point("t", &a, &a_path).unwrap();
        let first_dir = att.dir_point("t", &root).unwrap();
        a.write_all(b"y").unwrap();
        let (b, b_path) = create("b", b"b");
        att.commit_file(att.file_point("t", &b, &b_path).unwrap());
        let second_a = att.file_point("t", &a, &a_path).unwrap();
        let second_dir = att.dir_point("t", &root).unwrap();
        att.commit_file(second_a);
        att.commit_dir(second_dir);
        att.commit_file(first_a);
        att.commit_dir(first_dir);
        model.crash_and_restore().unwrap();
        assert_eq!(fs::read(&a_path).unwrap(), b"xy");
        assert_eq!(fs::read(&b_path).unwrap(), b"b");
    }

    #[test]
    fn a_name_without_a_directory_fsync_vanishes() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        let f = write_file(&seam, &root.join("a"), b"hello");
        seam.sync_data(&f, &root.join("a"), "t").unwrap();
        let (_, report) = model.crash_and_restore().unwrap();
        assert!(!root.join("a").exists());
        assert_eq!(report.names_dropped, 1);
    }

    #[test]
    fn synced_bytes_under_a_synced_name_survive_and_the_tail_is_lost() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        let path = root.join("a");
        let mut f = write_file(&seam, &path, b"hello");
        seam.sync_data(&f, &path, "t").unwrap();
        seam.sync_dir(&root, "t").unwrap();
        f.write_all(b" world").unwrap();
        let (_, report) = model.crash_and_restore().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        assert_eq!(report.torn_tails, 1);
    }

    #[test]
    fn a_durable_name_of_unsynced_bytes_keeps_none_of_them() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        let path = root.join("a");
        let _f = write_file(&seam, &path, b"hello");
        seam.sync_dir(&root, "t").unwrap();
        model.crash_and_restore().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn seeded_tails_are_damaged_in_every_way_and_reproducibly() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..32 {
            let mut outcomes = Vec::new();
            for _ in 0..2 {
                let (dir, model, seam) = setup(Some(seed));
                let root = dir.path().canonicalize().unwrap();
                let path = root.join("a");
                let mut f = write_file(&seam, &path, b"head");
                seam.sync_data(&f, &path, "t").unwrap();
                seam.sync_dir(&root, "t").unwrap();
                f.write_all(b"-unsynced-tail").unwrap();
                model.crash_and_restore().unwrap();
                outcomes.push(fs::read(&path).unwrap());
            }
            assert_eq!(outcomes[0], outcomes[1], "seed {seed} is not reproducible");
            let got = &outcomes[0];
            assert!(got.starts_with(b"head"));
            seen.insert(match &got[4..] {
                [] => "truncated",
                t if t.iter().all(|b| *b == 0) => "zeros",
                t if b"-unsynced-tail".starts_with(t) => "prefix",
                _ => "garbage",
            });
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn an_unlink_without_a_directory_fsync_is_undone_and_links_stay_links() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        seam.create_dir_all(&root.join("d")).unwrap();
        seam.sync_dir(&root, "t").unwrap();
        let (a, b) = (root.join("d/a"), root.join("d/b"));
        let f = write_file(&seam, &a, b"bytes");
        seam.sync_data(&f, &a, "t").unwrap();
        seam.hard_link(&a, &b).unwrap();
        seam.sync_dir(&root.join("d"), "t").unwrap();
        seam.remove_file(&a).unwrap();
        let (_, report) = model.crash_and_restore().unwrap();
        assert_eq!(report.names_restored, 1);
        assert_eq!(fs::read(&a).unwrap(), b"bytes");
        assert_eq!(
            fs::metadata(&a).unwrap().ino(),
            fs::metadata(&b).unwrap().ino()
        );
    }

    #[test]
    fn a_new_directory_whose_parent_was_not_fsynced_vanishes_with_its_names() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        seam.create_dir_all(&root.join("d/e")).unwrap();
        let path = root.join("d/e/a");
        let f = write_file(&seam, &path, b"x");
        seam.sync_data(&f, &path, "t").unwrap();
        seam.sync_dir(&root.join("d/e"), "t").unwrap();
        seam.sync_dir(&root.join("d"), "t").unwrap();
        model.crash_and_restore().unwrap();
        assert!(!root.join("d").exists());
    }

    #[test]
    fn after_the_crash_point_nothing_changes_and_every_call_fails() {
        let (dir, model, seam) = setup(None);
        let root = dir.path().canonicalize().unwrap();
        model.switch().arm(2);
        let path = root.join("a");
        let f = write_file(&seam, &path, b"x");
        seam.sync_data(&f, &path, "t").unwrap();
        assert!(seam.sync_dir(&root, "t").is_err());
        assert!(seam.create_new(&root.join("b")).is_err());
        assert!(seam.remove_file(&path).is_err());
        assert!(path.exists());
        let (_, report) = model.crash_and_restore().unwrap();
        assert!(!path.exists(), "{report:?}");
        let err = seam.alive().unwrap_err();
        assert!(err.get_ref().is_some_and(|e| e.is::<Crashed>()));
    }
}
