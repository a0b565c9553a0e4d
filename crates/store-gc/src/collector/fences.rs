//! Deletion fences left by sweepers that died mid-delete (ADR-021).

use super::*;

impl Collector {
    /// Finishes the deletes of sweepers that fenced keys and never cleared
    /// the fences (ADR-021): deletes the large-tier copies again
    /// (idempotent) and clears the fences.
    pub(super) async fn finish_stale_fences(
        &self,
        pins: &dyn BatchClauses,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        loop {
            cp.check().await?;
            let stale = pins.stale_fences(FENCE_GRACE, batch).await?;
            if stale.is_empty() {
                return Ok(());
            }
            let mut by_ns: BTreeMap<Namespace, Vec<Digest>> = BTreeMap::new();
            for k in &stale {
                by_ns.entry(k.namespace.clone()).or_default().push(k.digest);
            }
            for (ns, digests) in by_ns {
                let mut freed = vec![None; digests.len()];
                Self::delete_through(&self.tiers[1..], &ns, &digests, &mut freed).await?;
                report.resumed_deletes += freed.iter().filter(|f| f.is_some()).count() as u64;
            }
            pins.unfence(&stale).await?;
            if stale.len() < batch {
                return Ok(());
            }
        }
    }
}
