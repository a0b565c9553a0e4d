//! The direct delete: one key, arbitrated under its gate (or, fleet, in
//! a locked batch), removed from every tier that holds it.

use super::*;

impl Collector {
    /// Deletes `digests` of `ns` across `tiers` in order, each from the
    /// first tier that holds it; records the freed size of each (`None`
    /// when no tier held it) into `freed`, leaving entries already `Some`.
    pub(super) async fn delete_through(
        tiers: &[Arc<dyn Engine>],
        ns: &Namespace,
        digests: &[Digest],
        freed: &mut [Option<u64>],
    ) -> Result<()> {
        for tier in tiers {
            let pending: Vec<usize> = (0..digests.len()).filter(|i| freed[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<Digest> = pending.iter().map(|i| digests[*i]).collect();
            let res = tier.delete_many(ns, &batch).await?;
            for (i, r) in pending.into_iter().zip(res) {
                freed[i] = r;
            }
        }
        Ok(())
    }

    /// Deletes one key from **every** tier (a copy may sit in both after a
    /// threshold change): the summed freed size, `None` when no tier held
    /// it.
    pub(super) async fn delete_everywhere(
        tiers: &[Arc<dyn Engine>],
        key: &Key,
    ) -> Result<Option<u64>> {
        let mut freed = None;
        for tier in tiers {
            if let Some(size) = tier.delete_many(&key.namespace, &[key.digest]).await?[0] {
                freed = Some(freed.unwrap_or(0) + size);
            }
        }
        Ok(freed)
    }

    /// Whether each key (all of one namespace or not) exists in any tier.
    pub(super) async fn exists(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let mut out = vec![false; keys.len()];
        let mut by_ns: BTreeMap<&Namespace, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_ns.entry(&k.namespace).or_default().push(i);
        }
        for (ns, idx) in by_ns {
            for tier in &self.tiers {
                let ask: Vec<usize> = idx.iter().copied().filter(|i| !out[*i]).collect();
                if ask.is_empty() {
                    break;
                }
                let digests: Vec<Digest> = ask.iter().map(|i| keys[*i].digest).collect();
                for (i, present) in ask.into_iter().zip(tier.has_many(ns, &digests).await?) {
                    out[i] = present;
                }
            }
        }
        Ok(out)
    }

    /// A direct delete: refuses protected keys with [`Error::GcRefuse`],
    /// answers [`Error::Missing`] when no tier holds the key, and returns
    /// the freed size otherwise (every tier's copy is removed).
    ///
    /// Cancel-safe: the arbitration and the delete run in a task of their
    /// own that holds the protection (delete gate, or fleet batch and
    /// fence) until every media delete has finished; dropping this future
    /// only stops waiting for the answer.
    pub async fn delete(self: &Arc<Self>, key: &Key) -> Result<u64> {
        let this = Arc::clone(self);
        let key = key.clone();
        join(tokio::spawn(async move { this.delete_owned(key).await })).await
    }

    pub(super) async fn delete_owned(&self, key: Key) -> Result<u64> {
        let keys = [key.clone()];
        let snap = self.snapshot().await?;
        let protected = self
            .protected_set()
            .await
            .map_err(|e| Error::backend(e.kind(), "ask protect callback").with_source(e))?;
        let refuse = |reason| Error::GcRefuse {
            key: key.clone(),
            reason,
        };
        if let Some(pins) = &self.cfg.fleet_pins {
            let started = Instant::now();
            let mut attempt = 0u32;
            loop {
                // Read the clock before the batch: its transaction holds a
                // connection of the same pool.
                let now = self.now().await?;
                let mut batch = pins.begin_batch(&keys).await?;
                if batch.fenced(&keys).await?[0] {
                    // Another delete of this key is in flight: let it
                    // finish (its fence is its own to clear), then decide.
                    drop(batch);
                    if started.elapsed() >= BUSY_WAIT {
                        return Err(Error::backend(ErrorKind::TimedOut, "wait for deletion fence")
                            .with_key(&key)
                            .with_source(format!(
                                "the key is being deleted by another delete (fence held for more than {}s); retry",
                                BUSY_WAIT.as_secs()
                            )));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                    continue;
                }
                let tables = self.with_refs_table(&snap.tables, &keys);
                let sql = batch.protected(&keys, &tables, now).await?;
                if let Some(reason) = self.merge(&keys, sql, &protected)[0] {
                    return Err(refuse(reason));
                }
                let mut freed = batch.delete_entries(&key.namespace, &[key.digest]).await?[0];
                batch.fence(&keys).await?;
                batch.unstage(&keys).await?;
                batch.commit().await?;
                // The fence now protects the delete in flight (ADR-021).
                let large = retried(|| Self::delete_everywhere(&self.tiers[1..], &key)).await?;
                if let Some(size) = large {
                    freed = Some(freed.unwrap_or(0) + size);
                }
                retried(|| pins.unfence(&keys)).await?;
                return freed.ok_or(Error::Missing);
            }
        }
        let gate = loop {
            let (gate, states) = self.pins.gate(&keys);
            match states[0] {
                GateState::Pinned => return Err(refuse(ProtectReason::Pinned)),
                GateState::Gated => break gate,
                // Another delete of the same key is deciding; let it finish.
                GateState::Busy => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let reasons = self
            .arbitrate_local(&snap, &key.namespace, &keys, &[false], &protected)
            .await?;
        if let Some(reason) = reasons[0] {
            return Err(refuse(reason));
        }
        let freed = Self::delete_everywhere(&self.tiers, &key).await?;
        self.cfg.window_host.unstage(&keys).await?;
        drop(gate);
        freed.ok_or(Error::Missing)
    }
}
