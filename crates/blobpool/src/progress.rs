//! Progress bars (indicatif) for long transfers, on stderr only when it is
//! a terminal.

use std::io::IsTerminal;
use std::pin::Pin;
use std::task::{Context, Poll};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncRead, ReadBuf};

/// Transfers at least this large (or of unknown size) get a bar.
pub const PROGRESS_MIN_BYTES: u64 = 8 << 20;

/// A bar for a transfer of `len` bytes (`None`: unknown), or a hidden one
/// when progress is off, stderr is not a terminal, or the transfer is
/// small.
pub fn bar(enabled: bool, len: Option<u64>, what: &str) -> ProgressBar {
    let wanted =
        enabled && std::io::stderr().is_terminal() && len.is_none_or(|n| n >= PROGRESS_MIN_BYTES);
    if !wanted {
        return ProgressBar::hidden();
    }
    let (pb, template) = match len {
        Some(n) => (
            ProgressBar::new(n),
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{msg} {spinner} {bytes} {bytes_per_sec}",
        ),
    };
    if let Ok(style) = ProgressStyle::default_bar().template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// Counts bytes read through it on a bar.
pub struct ProgressRead<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R> ProgressRead<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, bar: ProgressBar) -> Self {
        ProgressRead { inner, bar }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for ProgressRead<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            this.bar.inc((buf.filled().len() - before) as u64);
        }
        r
    }
}
