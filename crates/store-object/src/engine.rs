//! The [`Engine`] and [`LargeEngine`] implementations.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};
use store_types::layout::parse_fan;
use store_types::{
    Capabilities, Digest, Engine, EntryMeta, Key, LargeEngine, Namespace, ReadOptions, Result,
    SizedRead, Stage, Timestamp,
};

use crate::error::backend_err;
use crate::stage::ObjectStage;
use crate::{Inner, ObjectEngine};

/// Objects one listing request returns (S3, GCS and Azure page at 1000).
const LIST_PAGE: usize = 1000;

#[async_trait]
impl Engine for ObjectEngine {
    /// Reaps stage objects older than [`ObjectOptions::staging_grace`]
    /// (leftovers of puts interrupted mid-upload or mid-publish).
    ///
    /// [`ObjectOptions::staging_grace`]: crate::ObjectOptions::staging_grace
    async fn maintain(&self, _now: store_types::Timestamp) -> Result<u64> {
        self.inner
            .reap_stale_stages(self.inner.options.staging_grace)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "object",
            instance: self.inner.instance.clone(),
            sharing: self.inner.sharing,
            durable: self.inner.durable,
            seam: None,
        }
    }

    /// A HEAD: size, and the last-modified time as the creation time.
    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        self.inner.meta(&self.inner.content_path(key)).await
    }

    /// Concurrent HEADs, except where at least
    /// [`crate::ObjectOptions::list_min_group`] digests share a fan-out
    /// prefix: that prefix is listed instead (with an ordered store,
    /// only from the smallest to the largest asked digest), falling back
    /// to HEADs once the listing has cost as many requests as the HEADs
    /// would have.
    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let inner = &self.inner;
        let mut groups: BTreeMap<u8, Vec<usize>> = BTreeMap::new();
        for (i, d) in digests.iter().enumerate() {
            groups.entry(d.as_bytes()[0]).or_default().push(i);
        }
        let mut jobs: Vec<Vec<usize>> = Vec::new();
        for (_, idx) in groups {
            if idx.len() >= inner.options.list_min_group.max(2) {
                jobs.push(idx);
            } else {
                jobs.extend(idx.into_iter().map(|i| vec![i]));
            }
        }
        let answers: Vec<Vec<(usize, bool)>> = futures::stream::iter(jobs)
            .map(|idx| async move {
                if let [i] = idx[..] {
                    let path = inner.digest_path(ns, &digests[i]);
                    return Ok(vec![(i, inner.exists(&path).await?)]);
                }
                inner.probe_fan(ns, digests, idx).await
            })
            .buffer_unordered(inner.options.request_concurrency.max(1))
            .try_collect()
            .await?;
        let mut out = vec![false; digests.len()];
        for (i, present) in answers.into_iter().flatten() {
            out[i] = present;
        }
        Ok(out)
    }

    /// A GET of the whole object; a span is sized with a HEAD first, then
    /// read with a ranged GET.
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        let path = self.inner.content_path(key);
        let size = async { Ok(self.inner.meta(&path).await?.map(|m| m.size)) };
        let whole = || self.inner.open_reader(&path, None);
        let span = |span: Range<u64>| self.inner.open_reader(&path, Some(span));
        options.read_with(size, whole, span).await
    }

    /// One GET of the outboard object (`None` if absent).
    async fn read_outboard(&self, key: &Key) -> Result<Option<bytes::Bytes>> {
        let inner = &self.inner;
        let path = inner.outboard_path(key);
        let got = match inner
            .retry("reading outboard", &path, || {
                inner
                    .store
                    .get_opts(&path, object_store::GetOptions::default())
            })
            .await
        {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(crate::error::backend_err("reading outboard", &path, e)),
        };
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| crate::error::backend_err("reading outboard", &path, e))
    }

    /// Writes the outboard object of an existing entry that has none.
    async fn store_outboard(&self, key: &Key, outboard: bytes::Bytes) -> Result<()> {
        let inner = &self.inner;
        if !inner.exists(&inner.content_path(key)).await?
            || inner.exists(&inner.outboard_path(key)).await?
        {
            return Ok(());
        }
        inner.put_outboard(key, &outboard).await
    }

    /// Concurrent HEADs for the sizes, then one bulk delete of the present
    /// ones (S3 `DeleteObjects`; other stores delete one by one). Two
    /// deletes of one key racing on a store whose delete succeeds for
    /// absent objects (S3) may both report its size.
    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let inner = &self.inner;
        let mut freed: Vec<Option<u64>> = futures::stream::iter(digests.iter().copied())
            .map(|d| async move {
                let m = inner.meta(&inner.digest_path(ns, &d)).await?;
                Ok::<_, store_types::Error>(m.map(|m| m.size))
            })
            .buffered(inner.options.request_concurrency.max(1))
            .try_collect()
            .await?;
        let present: Vec<(usize, Path)> = freed
            .iter()
            .enumerate()
            .filter(|(_, f)| f.is_some())
            .map(|(i, _)| (i, inner.digest_path(ns, &digests[i])))
            .collect();
        if present.is_empty() {
            return Ok(freed);
        }
        let paths: Vec<Path> = present.iter().map(|(_, p)| p.clone()).collect();
        let results: Vec<object_store::Result<Path>> = inner
            .store
            .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed())
            .collect()
            .await;
        if results.len() != present.len() {
            return Err(store_types::Error::backend(
                store_types::ErrorKind::InvalidData,
                "object store: bulk delete",
            )
            .with_source(format!(
                "the store answered {} of {} objects",
                results.len(),
                present.len()
            )));
        }
        for ((i, path), r) in present.into_iter().zip(results) {
            match r {
                Ok(_) => {}
                Err(object_store::Error::NotFound { .. }) => freed[i] = None,
                Err(e) => {
                    // Retry this one alone (bulk errors may be whole-batch).
                    match inner.store.delete(&path).await {
                        Ok(()) => {}
                        Err(object_store::Error::NotFound { .. }) => freed[i] = None,
                        Err(e2) => {
                            tracing::debug!(first = %e, "bulk delete failed");
                            return Err(backend_err("deleting", &path, e2));
                        }
                    }
                }
            }
        }
        // The entries first, their outboards second.
        inner.delete_outboards(ns, digests, &freed).await?;
        Ok(freed)
    }

    /// The prefix's "directories" that are valid namespaces holding at
    /// least one entry.
    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let inner = &self.inner;
        let candidates: Vec<Namespace> = inner
            .list_dirs(&inner.prefix)
            .await?
            .into_iter()
            .filter_map(|name| Namespace::new(name).ok())
            .collect();
        let checked: Vec<Option<Namespace>> = futures::stream::iter(candidates)
            .map(|ns| async move {
                let any = inner.scan(&ns, None, 1).await?;
                Ok::<_, store_types::Error>((!any.is_empty()).then_some(ns))
            })
            .buffered(inner.options.request_concurrency.max(1))
            .try_collect()
            .await?;
        let mut out: Vec<Namespace> = checked.into_iter().flatten().collect();
        out.sort();
        Ok(out)
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        self.inner.scan(ns, after, limit).await
    }
}

#[async_trait]
impl LargeEngine for ObjectEngine {
    /// A stage buffers up to the multipart threshold, then streams into a
    /// multipart upload under `.stage/`.
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        Ok(Stage::Plain(Box::new(ObjectStage::new(
            self.inner.clone(),
            ns.clone(),
        ))))
    }

    /// Like [`LargeEngine::stage`], but a body beyond the multipart
    /// threshold streams into a multipart upload straight to `digest`'s
    /// final name: `publish` looks (an existing entry aborts the upload,
    /// `AlreadyPresent`) and completes the upload — no stage object, no
    /// publishing copy. An upload in progress is not an object on any
    /// object_store backend (S3 and S3-compatibles, GCS, Azure: parts are
    /// invisible until completion; `LocalFileSystem`: a `<name>#<n>` file
    /// it never lists or reads, renamed into place at completion;
    /// `InMemory`: parts held by the upload), so nothing is visible before
    /// `publish`. Off with [`crate::ObjectOptions::direct_expected_puts`].
    async fn stage_expecting(&self, ns: &Namespace, digest: &Digest) -> Result<Stage> {
        Ok(Stage::Plain(Box::new(ObjectStage::expecting(
            self.inner.clone(),
            ns.clone(),
            *digest,
        ))))
    }
}

impl Inner {
    /// Deletes the outboards of the `digests` of `ns` whose entries were
    /// deleted (`freed` is `Some`), in one bulk delete (an absent outboard
    /// is fine).
    async fn delete_outboards(
        &self,
        ns: &Namespace,
        digests: &[Digest],
        freed: &[Option<u64>],
    ) -> Result<()> {
        let outboards: Vec<Path> = digests
            .iter()
            .zip(freed)
            .filter(|(_, f)| f.is_some())
            .map(|(d, _)| self.outboard_path(&Key::new(ns.clone(), *d)))
            .collect();
        let results: Vec<object_store::Result<Path>> = self
            .store
            .delete_stream(futures::stream::iter(outboards.into_iter().map(Ok)).boxed())
            .collect()
            .await;
        for r in results {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(store_types::Error::backend(
                        store_types::ErrorKind::Other,
                        "object store: deleting outboards",
                    )
                    .with_source(e))
                }
            }
        }
        Ok(())
    }

    /// Size and last-modified time of the object at `path`, if any.
    pub(crate) async fn meta(&self, path: &Path) -> Result<Option<EntryMeta>> {
        match self.store.head(path).await {
            Ok(m) => Ok(Some(entry_meta(&m))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(backend_err("looking up", path, e)),
        }
    }

    /// Names of the "directories" directly under `dir`.
    async fn list_dirs(&self, dir: &Path) -> Result<Vec<String>> {
        let listing = self
            .store
            .list_with_delimiter((!dir.is_root()).then_some(dir))
            .await
            .map_err(|e| backend_err("listing", dir, e))?;
        Ok(listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect())
    }

    /// The digest an object under `ns` holds, if its name is a canonical
    /// `<ns>/<fan>/<digest>` with the right fan-out.
    fn entry_digest(&self, ns_path: &Path, location: &Path) -> Option<Digest> {
        let mut parts = location.prefix_match(ns_path)?;
        let fan = parse_fan(parts.next()?.as_ref())?;
        let digest = Digest::parse(parts.next()?.as_ref()).ok()?;
        if parts.next().is_some() || digest.as_bytes()[0] != fan {
            return None;
        }
        Some(digest)
    }

    /// See [`Engine::scan`].
    pub(crate) async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ns_path = self.ns_path(ns);
        if self.ordered {
            // One listing from `after` on, stopped as soon as `limit`
            // entries are in: ordered stores list in key order, which is
            // digest order under one namespace.
            return async {
                let mut stream = match &after {
                    Some(a) => self
                        .store
                        .list_with_offset(Some(&ns_path), &self.digest_path(ns, a)),
                    None => self.store.list(Some(&ns_path)),
                };
                let mut out = Vec::new();
                while let Some(meta) = stream.try_next().await? {
                    if let Some(d) = self.entry_digest(&ns_path, &meta.location) {
                        if after.is_none_or(|a| d > a) {
                            out.push((d, meta.size));
                            if out.len() == limit {
                                break;
                            }
                        }
                    }
                }
                Ok(out)
            }
            .await
            .map_err(|e| backend_err("listing", &ns_path, e));
        }
        // Unordered store: the fan-out "directories" in order, each listed
        // whole and sorted.
        let first_fan = after.map_or(0, |d| d.as_bytes()[0]);
        let mut fans: Vec<u8> = self
            .list_dirs(&ns_path)
            .await?
            .iter()
            .filter_map(|n| parse_fan(n))
            .filter(|f| *f >= first_fan)
            .collect();
        fans.sort_unstable();
        let mut out = Vec::new();
        for fan in fans {
            let fan_path = self.fan_path(ns, fan);
            let metas: Vec<ObjectMeta> = self
                .store
                .list(Some(&fan_path))
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| backend_err("listing", &fan_path, e))?;
            let mut entries: Vec<(Digest, u64)> = metas
                .iter()
                .filter_map(|m| Some((self.entry_digest(&ns_path, &m.location)?, m.size)))
                .filter(|(d, _)| after.is_none_or(|a| *d > a))
                .collect();
            entries.sort_unstable();
            for e in entries {
                out.push(e);
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Presence of `digests[idx]` (all in one fan-out prefix) by listing
    /// that prefix; falls back to HEADs for what the listing has not
    /// settled once it has cost as many requests as the HEADs would.
    async fn probe_fan(
        &self,
        ns: &Namespace,
        digests: &[Digest],
        idx: Vec<usize>,
    ) -> Result<Vec<(usize, bool)>> {
        let fan = digests[idx[0]].as_bytes()[0];
        let fan_path = self.fan_path(ns, fan);
        let ns_path = self.ns_path(ns);
        let wanted: HashMap<Digest, Vec<usize>> = idx.iter().fold(HashMap::new(), |mut m, &i| {
            m.entry(digests[i]).or_insert_with(Vec::new).push(i);
            m
        });
        let min = wanted.keys().min().copied().expect("non-empty group");
        let max = wanted.keys().max().copied().expect("non-empty group");
        let budget = idx.len() * LIST_PAGE;
        let (found, complete) = async {
            let mut stream = if self.ordered {
                // Start just before `min`: its 63-character prefix
                // sorts below it and above every smaller digest but
                // those sharing that prefix.
                let offset = fan_path.clone().join(&min.to_hex()[..63]);
                self.store.list_with_offset(Some(&fan_path), &offset)
            } else {
                self.store.list(Some(&fan_path))
            };
            let mut found = Vec::new();
            let mut seen = 0;
            while let Some(meta) = stream.try_next().await? {
                seen += 1;
                if let Some(d) = self.entry_digest(&ns_path, &meta.location) {
                    if self.ordered && d > max {
                        return Ok((found, true));
                    }
                    if wanted.contains_key(&d) {
                        found.push(d);
                    }
                }
                if seen >= budget {
                    return Ok((found, false));
                }
            }
            Ok((found, true))
        }
        .await
        .map_err(|e| backend_err("listing", &fan_path, e))?;
        let mut out = Vec::with_capacity(idx.len());
        for d in &found {
            for &i in &wanted[d] {
                out.push((i, true));
            }
        }
        let unsettled: Vec<Digest> = wanted
            .keys()
            .filter(|d| !found.contains(d))
            .copied()
            .collect();
        if complete {
            for d in unsettled {
                out.extend(wanted[&d].iter().map(|&i| (i, false)));
            }
            return Ok(out);
        }
        let heads: Vec<(Digest, bool)> = futures::stream::iter(unsettled)
            .map(|d| async move {
                let present = self.exists(&self.digest_path(ns, &d)).await?;
                Ok::<_, store_types::Error>((d, present))
            })
            .buffer_unordered(self.options.request_concurrency.max(1))
            .try_collect()
            .await?;
        for (d, present) in heads {
            out.extend(wanted[&d].iter().map(|&i| (i, present)));
        }
        Ok(out)
    }
}

/// The engine's view of an object's metadata.
pub(crate) fn entry_meta(m: &ObjectMeta) -> EntryMeta {
    EntryMeta {
        size: m.size,
        created_at: Timestamp(m.last_modified.timestamp_millis()),
    }
}
