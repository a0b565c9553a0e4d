//! An [`ObjectStore`] wrapper that fails chosen requests.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// A kind of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    CreateUpload,
    Part,
    Complete,
    AbortUpload,
    Get,
    List,
    Delete,
    Copy,
}

/// Fail the `nth` (1-based) request of kind `op` (of any kind if `None`).
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub op: Option<Op>,
    pub nth: usize,
    /// A transient (retryable) failure rather than a permanent one.
    pub transient: bool,
    /// Perform the request, then fail (a lost response). Only for puts,
    /// completes, deletes and copies.
    pub after: bool,
}

impl Rule {
    pub fn fail(op: Op, nth: usize) -> Rule {
        Rule {
            op: Some(op),
            nth,
            transient: false,
            after: false,
        }
    }
    pub fn any(nth: usize) -> Rule {
        Rule {
            op: None,
            nth,
            transient: false,
            after: false,
        }
    }
    pub fn transient(mut self) -> Rule {
        self.transient = true;
        self
    }
    pub fn after(mut self) -> Rule {
        self.after = true;
        self
    }
}

#[derive(Default)]
struct State {
    total: usize,
    per_op: HashMap<Op, usize>,
    rules: Vec<Rule>,
    fired: usize,
}

/// The wrapper. Clones share the counters and rules.
#[derive(Clone)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    state: Arc<Mutex<State>>,
    /// Answer conditional puts and copies with `NotImplemented`, like a
    /// store without them.
    pub no_conditional: bool,
}

impl FaultStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultStore {
            inner,
            state: Arc::default(),
            no_conditional: false,
        }
    }

    /// Adds a rule; counting restarts from zero.
    pub fn arm(&self, rule: Rule) {
        let mut s = self.state.lock().unwrap();
        s.total = 0;
        s.per_op.clear();
        s.rules.push(rule);
    }

    /// Removes every rule and resets the counters.
    pub fn disarm(&self) {
        let mut s = self.state.lock().unwrap();
        *s = State::default();
    }

    /// Requests seen since the last `arm`/`disarm`.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().total
    }

    /// Requests of kind `op` seen since the last `arm`/`disarm`.
    pub fn count(&self, op: Op) -> usize {
        self.state
            .lock()
            .unwrap()
            .per_op
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    /// How many injected failures have fired.
    pub fn fired(&self) -> usize {
        self.state.lock().unwrap().fired
    }

    /// Counts a request; `Some((error, after))` if it must fail.
    fn check(&self, op: Op, path: &str) -> Option<(object_store::Error, bool)> {
        let mut s = self.state.lock().unwrap();
        s.total += 1;
        let total = s.total;
        let n = {
            let c = s.per_op.entry(op).or_default();
            *c += 1;
            *c
        };
        let hit = s.rules.iter().copied().find(|r| match r.op {
            None => r.nth == total,
            Some(o) => o == op && r.nth == n,
        })?;
        s.fired += 1;
        let source = format!("injected fault in {op:?} #{n}").into();
        let e = if hit.transient {
            object_store::Error::Generic {
                store: "fault",
                source,
            }
        } else {
            object_store::Error::PermissionDenied {
                path: path.to_string(),
                source,
            }
        };
        Some((e, hit.after))
    }
}

impl fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.no_conditional && opts.mode == object_store::PutMode::Create {
            return Err(object_store::Error::NotImplemented {
                operation: "conditional put".into(),
                implementer: "FaultStore".into(),
            });
        }
        match self.check(Op::Put, location.as_ref()) {
            Some((e, false)) => Err(e),
            Some((e, true)) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(e)
            }
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if let Some((e, _)) = self.check(Op::CreateUpload, location.as_ref()) {
            return Err(e);
        }
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultUpload {
            upload,
            store: self.clone(),
            path: location.to_string(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if let Some((e, _)) = self.check(Op::Get, location.as_ref()) {
            return Err(e);
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        locations
            .then(move |loc| {
                let this = this.clone();
                async move {
                    let loc = loc?;
                    let fault = this.check(Op::Delete, loc.as_ref());
                    if let Some((e, false)) = fault {
                        return Err(e);
                    }
                    let mut one = this
                        .inner
                        .delete_stream(futures::stream::once(async { Ok(loc) }).boxed());
                    let r = one.next().await.unwrap_or_else(|| {
                        Err(object_store::Error::Generic {
                            store: "fault",
                            source: "delete answered nothing".into(),
                        })
                    });
                    match fault {
                        Some((e, true)) => {
                            r?;
                            Err(e)
                        }
                        _ => r,
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.check(Op::List, prefix.map_or("", |p| p.as_ref())) {
            Some((e, _)) => futures::stream::once(async { Err(e) }).boxed(),
            None => self.inner.list(prefix),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.check(Op::List, prefix.map_or("", |p| p.as_ref())) {
            Some((e, _)) => futures::stream::once(async { Err(e) }).boxed(),
            None => self.inner.list_with_offset(prefix, offset),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        if let Some((e, _)) = self.check(Op::List, prefix.map_or("", |p| p.as_ref())) {
            return Err(e);
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        if self.no_conditional && options.mode == object_store::CopyMode::Create {
            return Err(object_store::Error::NotSupported {
                source: "copy-if-not-exists".into(),
            });
        }
        match self.check(Op::Copy, to.as_ref()) {
            Some((e, false)) => Err(e),
            Some((e, true)) => {
                self.inner.copy_opts(from, to, options).await?;
                Err(e)
            }
            None => self.inner.copy_opts(from, to, options).await,
        }
    }
}

#[derive(Debug)]
struct FaultUpload {
    upload: Box<dyn MultipartUpload>,
    store: FaultStore,
    path: String,
}

#[async_trait]
impl MultipartUpload for FaultUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.store.check(Op::Part, &self.path) {
            Some((e, _)) => futures::future::ready(Err(e)).boxed(),
            None => self.upload.put_part(data),
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        match self.store.check(Op::Complete, &self.path) {
            Some((e, false)) => Err(e),
            Some((e, true)) => {
                self.upload.complete().await?;
                Err(e)
            }
            None => self.upload.complete().await,
        }
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        if let Some((e, _)) = self.store.check(Op::AbortUpload, &self.path) {
            return Err(e);
        }
        self.upload.abort().await
    }
}
