//! The measuring tap on a forwarded response: per body chunk one timestamp, one byte
//! count, a copy into the rolling tail and (for streams) the piece counter. The body
//! passes through unchanged and is never held whole; when it ends, the tail is scanned
//! for the engine's report, dropped, and only numbers and names leave as an
//! [`ExternalJob`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{Future, Stream};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::counter::PieceCounter;
use super::measure::{self, BodyKind, End, Endpoint, JobMeta, Observed};
use super::scan::{self, EngineReport};
use super::tail::Tail;
use crate::protocol::ExternalJob;

/// How much of the body's start an embeddings reply keeps: llama-server puts its
/// `usage` before the vectors, out of the tail's reach.
const HEAD_BYTES: usize = 1024;

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the response headers said, as far as the tap cares.
#[derive(Debug, Clone, Copy)]
pub struct ReplyHead {
    pub status: u16,
    pub kind: BodyKind,
    pub compressed: bool,
    pub content_length: Option<u64>,
}

/// Measures one forwarded request from the moment it is sent. Dropped unfinished (the
/// client left before the end), it still reports the job.
pub struct Tap {
    meta: Option<JobMeta>,
    sink: UnboundedSender<ExternalJob>,
    sent: Instant,
    started_unix_ms: u64,
    head: Option<ReplyHead>,
    first: Option<Instant>,
    last: Option<Instant>,
    bytes: u64,
    tail: Option<Tail>,
    start_bytes: Option<Vec<u8>>,
    counter: Option<PieceCounter>,
}

impl Tap {
    /// Starts the clock: call just before sending the request upstream.
    pub fn start(meta: JobMeta, sink: UnboundedSender<ExternalJob>) -> Self {
        Self {
            meta: Some(meta),
            sink,
            sent: Instant::now(),
            started_unix_ms: unix_ms(SystemTime::now()),
            head: None,
            first: None,
            last: None,
            bytes: 0,
            tail: None,
            start_bytes: None,
            counter: None,
        }
    }

    /// The upstream answered with these headers. Error answers and compressed bodies
    /// are timed only: nothing of them is copied.
    pub fn reply(&mut self, head: ReplyHead) {
        let readable = head.status < 400 && !head.compressed;
        let endpoint = self.meta.as_ref().map(|m| m.endpoint);
        if readable {
            self.tail = Some(Tail::new());
            if head.kind.is_stream() {
                self.counter = Some(PieceCounter::new());
            }
            if endpoint == Some(Endpoint::Embeddings) {
                self.start_bytes = Some(Vec::with_capacity(HEAD_BYTES));
            }
        }
        self.head = Some(head);
    }

    /// One body chunk went by.
    pub fn observe(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.bytes += chunk.len() as u64;
        if let Some(tail) = &mut self.tail {
            tail.push(chunk);
        }
        if let Some(counter) = &mut self.counter {
            counter.feed(chunk);
        }
        if let Some(start) = &mut self.start_bytes {
            let room = HEAD_BYTES - start.len();
            start.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }

    /// Ends the measurement and reports the job (once; later calls do nothing).
    pub fn finish(&mut self, end: End) {
        let Some(meta) = self.meta.take() else {
            return;
        };
        let end = match (end, self.head) {
            // hyper may stop polling once a sized body is complete: that is the end.
            (End::ClientGone, Some(head)) if head.content_length == Some(self.bytes) => {
                End::Complete
            }
            (end, _) => end,
        };
        let report = self.read_report();
        let head = self.head.unwrap_or(ReplyHead {
            status: 0,
            kind: BodyKind::Json,
            compressed: false,
            content_length: None,
        });
        let now = Instant::now();
        let seen = Observed {
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: unix_ms(SystemTime::now()),
            status: head.status,
            kind: head.kind,
            compressed: head.compressed,
            end,
            first_byte: self.first.map(|f| f - self.sent),
            span: match (self.first, self.last) {
                (Some(first), Some(last)) => last - first,
                _ => Duration::ZERO,
            },
            total: self.last.unwrap_or(now) - self.sent,
            report,
            pieces: self.counter.as_ref().map(PieceCounter::pieces),
        };
        // The recorder lives as long as the server; if it is gone there is nobody to tell.
        let _ = self.sink.send(measure::job(meta, &seen));
    }

    /// Scans the kept bytes and forgets them.
    fn read_report(&mut self) -> EngineReport {
        let mut report = EngineReport::default();
        if let Some(tail) = self.tail.take() {
            let mut bytes = Vec::new();
            tail.copy_to(&mut bytes);
            report = scan::scan(&bytes);
        }
        if let Some(start) = self.start_bytes.take() {
            if report.prompt_tokens.is_none() {
                report = scan::scan(&start);
            }
        }
        report
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.finish(End::ClientGone);
    }
}

/// A response body stream with the tap on it. It ends early when the server shuts
/// down, as sparkd's own streams do.
pub struct TappedBody<S> {
    inner: Pin<Box<S>>,
    tap: Tap,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S> TappedBody<S> {
    pub fn new(inner: S, tap: Tap, shutdown: CancellationToken) -> Self {
        Self {
            inner: Box::pin(inner),
            tap,
            shutdown: Box::pin(shutdown.cancelled_owned()),
        }
    }
}

impl<S, E> Stream for TappedBody<S>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.shutdown.as_mut().poll(cx).is_ready() {
            this.tap.finish(End::Shutdown);
            return Poll::Ready(None);
        }
        let polled = this.inner.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => this.tap.observe(chunk),
            Poll::Ready(Some(Err(_))) => this.tap.finish(End::UpstreamFailed),
            Poll::Ready(None) => this.tap.finish(End::Complete),
            Poll::Pending => {}
        }
        polled
    }
}
