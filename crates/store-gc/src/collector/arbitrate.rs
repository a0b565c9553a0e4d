//! Who protects a key: the protect callback, the in-process liveness
//! sources, references and cache keys, and (fleet) the SQL arbitration.

use super::*;

impl Collector {
    /// Asks the protect callback, if any.
    pub(super) async fn protected_set(&self) -> Result<HashSet<Key>> {
        match self.protect_cb() {
            Some(cb) => Ok(cb.protected_keys().await?.into_iter().collect()),
            None => Ok(HashSet::new()),
        }
    }

    /// OR over every in-process source of `ns`, the references and the
    /// cache keys;
    /// `false` when nothing names a key.
    pub(super) async fn probe(
        &self,
        sources: &Sources,
        ns: &Namespace,
        keys: &[Key],
    ) -> Result<Vec<bool>> {
        let mut live = vec![false; keys.len()];
        if keys.is_empty() {
            return Ok(live);
        }
        if let Some(refs) = &self.cfg.refs {
            let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
            let answer = refs.referenced(ns, &digests).await;
            or_into(&mut live, answer, "probe references", ns)?;
        }
        if let Some(cache) = &self.cfg.cache {
            let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
            let answer = cache.cached(ns, &digests).await;
            or_into(&mut live, answer, "probe cache keys", ns)?;
        }
        for (_, src) in sources.get(ns).into_iter().flatten() {
            let answer = src.probe(keys).await;
            or_into(&mut live, answer, "probe liveness source", ns)?;
        }
        Ok(live)
    }

    /// In-process arbitration of keys of one namespace (`pinned` known).
    pub(super) async fn arbitrate_local(
        &self,
        snap: &Snapshot,
        ns: &Namespace,
        keys: &[Key],
        pinned: &[bool],
        protected: &HashSet<Key>,
    ) -> Result<Vec<Option<ProtectReason>>> {
        let unpinned: Vec<Key> = keys
            .iter()
            .zip(pinned)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| k.clone())
            .collect();
        let mut live = self.probe(&snap.sources, ns, &unpinned).await?.into_iter();
        Ok(keys
            .iter()
            .zip(pinned)
            .map(|(k, p)| {
                if *p {
                    Some(ProtectReason::Pinned)
                } else if live.next().unwrap_or(false) {
                    Some(ProtectReason::Live)
                } else if protected.contains(k) {
                    Some(ProtectReason::ProtectCallback)
                } else {
                    None
                }
            })
            .collect())
    }

    /// Merges SQL arbitration with this node's pins and protect set.
    pub(super) fn merge(
        &self,
        keys: &[Key],
        sql: Vec<Option<ProtectReason>>,
        protected: &HashSet<Key>,
    ) -> Vec<Option<ProtectReason>> {
        let local = self.pins.pinned_many(keys);
        keys.iter()
            .zip(sql)
            .zip(local)
            .map(|((k, r), p)| {
                if p {
                    Some(ProtectReason::Pinned)
                } else if r.is_some() {
                    r
                } else if protected.contains(k) {
                    Some(ProtectReason::ProtectCallback)
                } else {
                    None
                }
            })
            .collect()
    }
}
