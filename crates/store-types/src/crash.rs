//! The crash switch shared by the engines' crash models (issue 14).
//!
//! A crash model records what an engine has made durable (bytes fsynced,
//! renames and links whose directory was fsynced, committed transactions)
//! and, when the process "crashes", throws away everything else before the
//! engine is opened again — the idea of redb's crash-consistency backend.
//! The engines' models (store-local's file layer, store-sqlite's VFS)
//! report each **durability point** (a call that makes something durable:
//! `fsync`, `fdatasync`, a directory fsync, a commit's sync) to one
//! [`CrashSwitch`]. A test arms the switch to crash at the `n`-th point;
//! from that point on every durability point refuses, as if the machine
//! had stopped, and the model's durable image is what a reopen sees.
//!
//! The switch is cheap and always compiled; engines consult it only when a
//! crash model is installed (a testing option), never on the normal path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counts durability points and crashes at an armed one.
///
/// Cloning shares the switch. Points are numbered from 1 in the order
/// engines report them; with several engines on one switch the order
/// interleaves, which is what a whole-machine crash means.
#[derive(Clone, Debug, Default)]
pub struct CrashSwitch {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Durability points reported so far (including refused ones).
    points: AtomicU64,
    /// Crash when `points` reaches this value (0: never).
    crash_at: AtomicU64,
    crashed: AtomicBool,
    /// The labels of the points reported, for failure messages.
    trace: Mutex<Vec<&'static str>>,
}

/// What a durability point answers after the crash: the operation must
/// not take effect durably (the model drops it) and should fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("crash model: the process crashed at durability point {at}")]
pub struct Crashed {
    /// The point the crash happened at.
    pub at: u64,
}

impl CrashSwitch {
    /// A switch that never crashes until [`CrashSwitch::arm`]ed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Crash at the `n`-th durability point from the start (1-based); the
    /// `n`-th point itself does not become durable.
    pub fn arm(&self, n: u64) {
        self.inner.crash_at.store(n, Ordering::SeqCst);
    }

    /// Crashes now: every later durability point refuses.
    pub fn crash_now(&self) {
        self.inner.crashed.store(true, Ordering::SeqCst);
    }

    /// Whether the crash has happened.
    pub fn crashed(&self) -> bool {
        self.inner.crashed.load(Ordering::SeqCst)
    }

    /// How many durability points have been reported.
    pub fn points(&self) -> u64 {
        self.inner.points.load(Ordering::SeqCst)
    }

    /// The labels of the reported points, in order.
    pub fn trace(&self) -> Vec<&'static str> {
        self.inner.trace.lock().expect("crash trace").clone()
    }

    /// Reports a durability point labelled `label` (`"local: fsync stage"`).
    /// `Ok` means it may become durable; `Err` means the process has
    /// crashed (at this point or earlier) and it must not.
    pub fn point(&self, label: &'static str) -> Result<(), Crashed> {
        let n = self.inner.points.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.trace.lock().expect("crash trace").push(label);
        let at = self.inner.crash_at.load(Ordering::SeqCst);
        if self.crashed() || (at != 0 && n >= at) {
            self.inner.crashed.store(true, Ordering::SeqCst);
            return Err(Crashed { at: at.min(n).max(1) });
        }
        Ok(())
    }

    /// Starts a new life after a crash and reopen: not crashed, disarmed,
    /// points counted from zero again.
    pub fn reset(&self) {
        self.inner.crashed.store(false, Ordering::SeqCst);
        self.inner.crash_at.store(0, Ordering::SeqCst);
        self.inner.points.store(0, Ordering::SeqCst);
        self.inner.trace.lock().expect("crash trace").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crashes_at_the_armed_point_and_after() {
        let s = CrashSwitch::new();
        s.arm(3);
        assert!(s.point("a").is_ok());
        assert!(s.point("b").is_ok());
        assert_eq!(s.point("c"), Err(Crashed { at: 3 }));
        assert!(s.point("d").is_err());
        assert!(s.crashed());
        assert_eq!(s.trace(), vec!["a", "b", "c", "d"]);
        s.reset();
        assert!(!s.crashed());
        assert!(s.point("a").is_ok());
        assert_eq!(s.points(), 1);
    }

    #[test]
    fn an_unarmed_switch_never_crashes() {
        let s = CrashSwitch::new();
        for _ in 0..100 {
            assert!(s.point("p").is_ok());
        }
        s.crash_now();
        assert!(s.point("p").is_err());
    }
}
