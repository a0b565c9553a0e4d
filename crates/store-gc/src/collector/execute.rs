//! Executing due candidates: re-arbitrated, deleted, counted — in
//! process under the delete gate, or (fleet) in locked, fenced batches.

use super::*;

impl Collector {
    pub(super) async fn execute_due(
        &self,
        protected: &HashSet<Key>,
        now: Timestamp,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let window = &self.cfg.window_host;
        let mut after: Option<Key> = None;
        loop {
            cp.check().await?;
            let due = window.take_due(now, after.as_ref(), batch).await?;
            let Some(last) = due.last() else { break };
            after = Some(last.key.clone());
            let keys: Vec<Key> = due.iter().map(|c| c.key.clone()).collect();
            // Re-read per batch: a source deregistered, a policy changed or
            // a table registered since the sweep began counts now.
            let snap = self.snapshot().await?;
            match &self.cfg.fleet_pins {
                Some(pins) => {
                    self.execute_fleet(pins.as_ref(), &snap, protected, now, keys, report)
                        .await?
                }
                None => self.execute_local(&snap, protected, keys, report).await?,
            }
        }
        Ok(())
    }

    /// Records the outcome of one namespace's doomed and rescued keys:
    /// a rescued key whose entry is gone counts as vanished.
    pub(super) fn tally(
        report: &mut SweepReport,
        ns: &Namespace,
        rescued: &[bool],
        freed: &[Option<u64>],
    ) {
        let counts = report.ns(ns);
        for present in rescued {
            if *present {
                counts.rescued += 1;
            } else {
                counts.vanished += 1;
            }
        }
        for f in freed {
            match f {
                Some(size) => {
                    counts.deleted += 1;
                    counts.bytes_freed += size;
                }
                None => counts.vanished += 1,
            }
        }
    }

    /// The non-fleet execute step for one batch of due keys. Keys another
    /// delete holds (a direct delete deciding) are retried once it is done,
    /// so every due key is counted and unstaged exactly once.
    pub(super) async fn execute_local(
        &self,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        keys: Vec<Key>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut pending = keys;
        while !pending.is_empty() {
            let (gate, states) = self.pins.gate(&pending);
            let mut done: Vec<Key> = Vec::with_capacity(pending.len());
            let mut busy: Vec<Key> = Vec::new();
            let mut rescued: Vec<Key> = Vec::new();
            // take_due orders by key, so namespaces come in runs.
            let mut by_ns: BTreeMap<Namespace, Vec<Key>> = BTreeMap::new();
            for (k, st) in pending.iter().zip(&states) {
                match st {
                    GateState::Pinned => rescued.push(k.clone()),
                    GateState::Busy => busy.push(k.clone()),
                    GateState::Gated if !snap.has_source(&k.namespace) => rescued.push(k.clone()),
                    GateState::Gated => by_ns
                        .entry(k.namespace.clone())
                        .or_default()
                        .push(k.clone()),
                }
            }
            for (ns, ks) in by_ns {
                let pinned = vec![false; ks.len()];
                let reasons = self
                    .arbitrate_local(snap, &ns, &ks, &pinned, protected)
                    .await?;
                let mut doomed: Vec<Digest> = Vec::new();
                for (k, r) in ks.into_iter().zip(&reasons) {
                    match r {
                        Some(_) => rescued.push(k),
                        None => doomed.push(k.digest),
                    }
                }
                let freed = self.delete_doomed(&ns, &doomed, &mut done).await?;
                Self::tally(report, &ns, &[], &freed);
            }
            self.tally_rescued(report, &rescued).await?;
            done.extend(rescued);
            window_unstage(self.cfg.window_host.as_ref(), &done).await?;
            drop(gate);
            if !busy.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            pending = busy;
        }
        Ok(())
    }

    /// Deletes the doomed `digests` of `ns` through the tiers in order
    /// (each from the first tier that holds it) and returns the freed size
    /// of each. Pushes onto `unstage` the keys still to unstage: all of
    /// them, or — when the window host deletes the first tier's copies and
    /// unstages them in one transaction (ADR-081) — only those that tier
    /// did not hold.
    async fn delete_doomed(
        &self,
        ns: &Namespace,
        digests: &[Digest],
        unstage: &mut Vec<Key>,
    ) -> Result<Vec<Option<u64>>> {
        let (mut freed, unstaged, rest) = match &self.cfg.window_deletes {
            Some(deletes) => {
                let freed = deletes.delete_unstaging(ns, digests).await?;
                let unstaged: Vec<bool> = freed.iter().map(Option::is_some).collect();
                (freed, unstaged, &self.tiers[1..])
            }
            None => (
                vec![None; digests.len()],
                vec![false; digests.len()],
                &self.tiers[..],
            ),
        };
        Self::delete_through(rest, ns, digests, &mut freed).await?;
        let pending = digests.iter().zip(unstaged).filter(|(_, u)| !*u);
        unstage.extend(pending.map(|(d, _)| Key::new(ns.clone(), *d)));
        Ok(freed)
    }

    /// Counts rescued keys, as vanished when their entry is already gone.
    pub(super) async fn tally_rescued(
        &self,
        report: &mut SweepReport,
        rescued: &[Key],
    ) -> Result<()> {
        if rescued.is_empty() {
            return Ok(());
        }
        let present = self.exists(rescued).await?;
        for (k, p) in rescued.iter().zip(present) {
            Self::tally(report, &k.namespace, &[p], &[]);
        }
        Ok(())
    }

    /// The fleet execute step for one batch: lock every key on the GC host,
    /// re-arbitrate in SQL under the locks, delete the kv rows and write a
    /// deletion fence for every doomed key inside the locked transaction,
    /// unstage, commit; then delete the large-tier copies — protected by
    /// the fences, not by the session's locks, so losing the session
    /// cannot expose a delete in flight — and clear the fences (ADR-021).
    pub(super) async fn execute_fleet(
        &self,
        pins: &dyn BatchClauses,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        now: Timestamp,
        keys: Vec<Key>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut tx = pins.begin_batch(&keys).await?;
        // A key another delete has fenced is left alone — not deleted, not
        // fenced again, not unstaged: its fencer clears the fence when its
        // delete is done, and a later sweep finds the key gone (vanished).
        let fenced = tx.fenced(&keys).await?;
        let keys: Vec<Key> = keys
            .into_iter()
            .zip(fenced)
            .filter(|(_, f)| !*f)
            .map(|(k, _)| k)
            .collect();
        let tables = self.with_refs_table(&snap.tables, &keys);
        let sql = tx.protected(&keys, &tables, now).await?;
        let reasons = self.merge(&keys, sql, protected);
        let mut by_ns: BTreeMap<Namespace, Vec<Digest>> = BTreeMap::new();
        let mut rescued: Vec<Key> = Vec::new();
        for (k, r) in keys.iter().zip(&reasons) {
            if r.is_some() || !snap.has_source(&k.namespace) {
                rescued.push(k.clone());
            } else {
                by_ns.entry(k.namespace.clone()).or_default().push(k.digest);
            }
        }
        let mut freed_by_ns = Vec::with_capacity(by_ns.len());
        // Only keys whose kv delete freed nothing can have a large copy to
        // delete (fall-through order): fence just those.
        let mut fence_keys: Vec<Key> = Vec::new();
        for (ns, doomed) in by_ns {
            let freed = tx.delete_entries(&ns, &doomed).await?;
            for (d, f) in doomed.iter().zip(&freed) {
                if f.is_none() {
                    fence_keys.push(Key::new(ns.clone(), *d));
                }
            }
            freed_by_ns.push((ns, doomed, freed));
        }
        tx.fence(&fence_keys).await?;
        tx.unstage(&keys).await?;
        tx.commit().await?;
        // Committed: the kv deletes count now, whatever happens next.
        for (ns, _, freed) in &freed_by_ns {
            let kv_freed: Vec<Option<u64>> =
                freed.iter().copied().filter(Option::is_some).collect();
            Self::tally(report, ns, &[], &kv_freed);
        }
        for (ns, doomed, freed) in &freed_by_ns {
            let pending: Vec<Digest> = doomed
                .iter()
                .zip(freed)
                .filter(|(_, f)| f.is_none())
                .map(|(d, _)| *d)
                .collect();
            if pending.is_empty() {
                continue;
            }
            let pending = &pending;
            let large = retried(|| async move {
                let mut out = vec![None; pending.len()];
                Self::delete_through(&self.tiers[1..], ns, pending, &mut out).await?;
                Ok(out)
            })
            .await?;
            Self::tally(report, ns, &[], &large);
        }
        retried(|| pins.unfence(&fence_keys)).await?;
        self.tally_rescued(report, &rescued).await
    }
}
