//! Marking: scanning every namespace with a liveness source and staging
//! the unprotected entries into the delete window.

use super::*;

impl Collector {
    pub(super) async fn mark(
        &self,
        protected: &HashSet<Key>,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut namespaces = BTreeSet::new();
        for tier in &self.tiers {
            namespaces.extend(tier.namespaces().await?);
        }
        for ns in namespaces {
            if !self.snapshot().await?.has_source(&ns) {
                report.unswept_namespaces.push(ns);
                continue;
            }
            for (t, tier) in self.tiers.iter().enumerate() {
                let mut after = None;
                loop {
                    cp.check().await?;
                    // The window starts when the candidate is staged, not
                    // when the sweep began.
                    let now = self.now().await?;
                    let visible_after = now.plus(self.cfg.window);
                    let page = tier.scan(&ns, after, batch).await?;
                    let Some(last) = page.last() else { break };
                    after = Some(last.0);
                    let fresh = self.unstaged(&ns, t, &page).await?;
                    if fresh.is_empty() {
                        continue;
                    }
                    let keys: Vec<Key> = fresh.iter().map(|(k, _)| k.clone()).collect();
                    // Re-read per page, as the execute phase does per batch.
                    let snap = self.snapshot().await?;
                    if !snap.has_source(&ns) {
                        break;
                    }
                    let reasons = match &self.cfg.fleet_pins {
                        Some(pins) => {
                            let tables = self.with_refs_table(&snap.tables, &keys);
                            let sql = pins.arbitrate(&keys, &tables, now).await?;
                            self.merge(&keys, sql, protected)
                        }
                        None => {
                            let pinned = self.pins.pinned_many(&keys);
                            self.arbitrate_local(&snap, &ns, &keys, &pinned, protected)
                                .await?
                        }
                    };
                    let counts = report.ns(&ns);
                    self.stage_unprotected(counts, fresh, reasons, visible_after)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// The entries of `page` (of tier `t`) to arbitrate: those not staged
    /// already, nor held by an earlier tier (a copy left there by a
    /// threshold change was arbitrated with that tier: counted once).
    async fn unstaged(
        &self,
        ns: &Namespace,
        t: usize,
        page: &[(Digest, u64)],
    ) -> Result<Vec<(Key, u64)>> {
        let digests: Vec<Digest> = page.iter().map(|(d, _)| *d).collect();
        let mut skip = self.cfg.window_host.staged_many(ns, &digests).await?;
        for earlier in &self.tiers[..t] {
            let held = earlier.has_many(ns, &digests).await?;
            for (s, h) in skip.iter_mut().zip(held) {
                *s |= h;
            }
        }
        Ok(page
            .iter()
            .zip(skip)
            .filter(|(_, s)| !*s)
            .map(|((d, size), _)| (Key::new(ns.clone(), *d), *size))
            .collect())
    }

    /// Counts the arbitrated `fresh` entries by their protection `reasons`
    /// and stages the unprotected ones, deletable after `visible_after`.
    async fn stage_unprotected(
        &self,
        counts: &mut crate::report::NamespaceCounts,
        fresh: Vec<(Key, u64)>,
        reasons: Vec<Option<ProtectReason>>,
        visible_after: Timestamp,
    ) -> Result<()> {
        let mut candidates = Vec::new();
        counts.scanned += fresh.len() as u64;
        for ((key, size), reason) in fresh.into_iter().zip(reasons) {
            match reason {
                Some(ProtectReason::Pinned) => counts.protected.pinned += 1,
                Some(ProtectReason::Live) => counts.protected.live += 1,
                Some(ProtectReason::ProtectCallback) => counts.protected.protect_callback += 1,
                None => candidates.push(StagedCandidate {
                    key,
                    size,
                    visible_after,
                }),
            }
        }
        counts.staged += candidates.len() as u64;
        self.cfg.window_host.stage(&candidates).await
    }
}
