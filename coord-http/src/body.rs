//! The bodies the layer hands on (requests to the inner service, responses to the client), and
//! reading a body up to a limit.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service receives.
    ///
    /// For a guarded request, the bytes the layer read to fingerprint it (and the trailers, if
    /// the client sent any); for any other request, the client's body untouched.
    pub struct RequestBody<B> {
        #[pin]
        state: RequestState<B>,
    }
}

pin_project! {
    #[project = RequestStateProj]
    enum RequestState<B> {
        Buffered { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Streaming { #[pin] inner: B },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        RequestBody {
            state: RequestState::Buffered {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn streaming(inner: B) -> Self {
        RequestBody {
            state: RequestState::Streaming { inner },
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().state.project() {
            RequestStateProj::Buffered { data, trailers } => Poll::Ready(take_full(data, trailers)),
            RequestStateProj::Streaming { inner } => inner.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            RequestState::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
            RequestState::Streaming { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            RequestState::Buffered { data, .. } => full_hint(data),
            RequestState::Streaming { inner } => inner.size_hint(),
        }
    }
}

pin_project! {
    /// The response body the layer sends.
    ///
    /// A replay or a problem document is a complete body in memory, and so is a response the
    /// layer stored. Responses it does not store pass through as the inner service's body
    /// (behind the bytes the layer already read, when it had to read some to find out).
    pub struct ResponseBody<B: Body> {
        #[pin]
        state: ResponseState<B>,
    }
}

pin_project! {
    #[project = ResponseStateProj]
    enum ResponseState<B: Body> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Streaming { #[pin] inner: B },
        Resumed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        Failed { prefix: Option<Bytes>, error: Option<B::Error> },
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ResponseBody {
            state: ResponseState::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn streaming(inner: B) -> Self {
        ResponseBody {
            state: ResponseState::Streaming { inner },
        }
    }

    /// The rest of a body of which `prefix` was already read.
    pub(crate) fn resumed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        ResponseBody {
            state: ResponseState::Resumed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }

    /// `prefix`, then `error`: a body that failed while the layer read it fails the same way
    /// for the client.
    pub(crate) fn failed(prefix: Bytes, error: B::Error) -> Self {
        ResponseBody {
            state: ResponseState::Failed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                error: Some(error),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().state.project() {
            ResponseStateProj::Full { data, trailers } => Poll::Ready(take_full(data, trailers)),
            ResponseStateProj::Streaming { inner } => inner.poll_frame(cx),
            ResponseStateProj::Resumed { prefix, rest } => match prefix.take() {
                Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
                None => rest.as_mut().poll_frame(cx),
            },
            ResponseStateProj::Failed { prefix, error } => match prefix.take() {
                Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
                None => Poll::Ready(error.take().map(Err)),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            ResponseState::Full { data, trailers } => data.is_none() && trailers.is_none(),
            ResponseState::Streaming { inner } => inner.is_end_stream(),
            ResponseState::Resumed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            ResponseState::Failed { prefix, error } => prefix.is_none() && error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            ResponseState::Full { data, .. } => full_hint(data),
            ResponseState::Streaming { inner } => inner.size_hint(),
            ResponseState::Resumed { prefix, rest } => {
                let read = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            ResponseState::Failed { .. } => SizeHint::default(),
        }
    }
}

fn take_full<E>(
    data: &mut Option<Bytes>,
    trailers: &mut Option<HeaderMap>,
) -> Option<Result<Frame<Bytes>, E>> {
    if let Some(data) = data.take() {
        return Some(Ok(Frame::data(data)));
    }
    trailers.take().map(|t| Ok(Frame::trailers(t)))
}

fn full_hint(data: &Option<Bytes>) -> SizeHint {
    SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
}

/// Accumulates data frames without copying the first one.
#[derive(Default)]
struct Accumulator {
    first: Option<Bytes>,
    more: Option<BytesMut>,
    len: usize,
}

impl Accumulator {
    fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.len += chunk.len();
        match (&mut self.first, &mut self.more) {
            (None, _) => self.first = Some(chunk),
            (Some(first), None) => {
                let mut buf = BytesMut::with_capacity(first.len() + chunk.len());
                buf.extend_from_slice(first);
                buf.extend_from_slice(&chunk);
                self.more = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&chunk),
        }
    }

    fn finish(self) -> Bytes {
        match (self.first, self.more) {
            (_, Some(buf)) => buf.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        }
    }
}

/// A request body read to the end.
pub(crate) struct ReadRequest {
    pub(crate) data: Bytes,
    pub(crate) trailers: Option<HeaderMap>,
}

/// Why a request body was not read to the end.
pub(crate) enum ReadError<E> {
    /// Longer than the limit (announced or counted).
    TooLarge,
    /// The body failed.
    Failed(E),
}

/// Reads a request body of at most `limit` bytes. A body that announces more is refused
/// before any of it is read.
pub(crate) async fn read_request<B>(
    body: B,
    limit: usize,
) -> Result<ReadRequest, ReadError<B::Error>>
where
    B: Body<Data = Bytes>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(ReadError::TooLarge);
    }
    let mut body = std::pin::pin!(body);
    let mut acc = Accumulator::default();
    let mut trailers = None;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(ReadError::Failed)?;
        match frame.into_data() {
            Ok(data) => {
                if acc.len.saturating_add(data.len()) > limit {
                    return Err(ReadError::TooLarge);
                }
                acc.push(data);
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers.get_or_insert_with(HeaderMap::new).extend(t);
                }
            }
        }
    }
    Ok(ReadRequest {
        data: acc.finish(),
        trailers,
    })
}

/// A response body as the layer found it while reading up to its storage limit.
pub(crate) enum ReadResponse<B: Body> {
    /// Read to the end, within the limit.
    Complete {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Longer than the limit: what was read, and the rest still to be sent. `announced` is the
    /// length the body declared, when it declared one.
    TooLarge {
        prefix: Bytes,
        rest: Pin<Box<B>>,
        announced: Option<u64>,
    },
    /// The body failed after `prefix`.
    Failed { prefix: Bytes, error: B::Error },
}

/// Reads a response body while it fits in `limit` bytes; stops reading at the first chunk
/// that does not fit (or at once, when the body announces a longer length).
pub(crate) async fn read_response<B>(body: B, limit: usize) -> ReadResponse<B>
where
    B: Body<Data = Bytes>,
{
    let mut body = Box::pin(body);
    let hint = body.size_hint();
    if hint.lower() > limit as u64 {
        return ReadResponse::TooLarge {
            prefix: Bytes::new(),
            announced: hint.exact(),
            rest: body,
        };
    }
    let mut acc = Accumulator::default();
    let mut trailers = None;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                return ReadResponse::Failed {
                    prefix: acc.finish(),
                    error,
                };
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if acc.len.saturating_add(data.len()) > limit {
                    acc.push(data);
                    return ReadResponse::TooLarge {
                        prefix: acc.finish(),
                        announced: hint.exact(),
                        rest: body,
                    };
                }
                acc.push(data);
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers.get_or_insert_with(HeaderMap::new).extend(t);
                }
            }
        }
    }
    ReadResponse::Complete {
        data: acc.finish(),
        trailers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use std::convert::Infallible;

    fn chunks(parts: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = Infallible> + use<> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn request_within_the_limit_is_read_whole() {
        let read = read_request(chunks(&[b"ab", b"cd", b"e"]), 5).await;
        let Ok(read) = read else { panic!("refused") };
        assert_eq!(&read.data[..], b"abcde");
    }

    #[tokio::test]
    async fn request_over_the_limit_is_refused() {
        assert!(matches!(
            read_request(chunks(&[b"ab", b"cd", b"ef"]), 5).await,
            Err(ReadError::TooLarge)
        ));
        assert!(matches!(
            read_request(Full::new(Bytes::from_static(b"abcdef")), 5).await,
            Err(ReadError::TooLarge)
        ));
    }

    #[tokio::test]
    async fn response_over_the_limit_keeps_every_byte() {
        let read = read_response(chunks(&[b"ab", b"cd", b"ef", b"gh"]), 5).await;
        let ReadResponse::TooLarge { prefix, rest, .. } = read else {
            panic!("not too large")
        };
        assert_eq!(&prefix[..], b"abcdef");
        let body = ResponseBody::resumed(prefix, rest);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"abcdefgh");
    }

    #[tokio::test]
    async fn response_announcing_more_than_the_limit_is_not_read() {
        let read = read_response(Full::new(Bytes::from_static(b"abcdef")), 5).await;
        let ReadResponse::TooLarge {
            prefix, announced, ..
        } = read
        else {
            panic!("not too large")
        };
        assert!(prefix.is_empty());
        assert_eq!(announced, Some(6));
    }

    #[tokio::test]
    async fn response_within_the_limit_is_complete() {
        let read = read_response(chunks(&[b"ab", b"", b"cde"]), 5).await;
        let ReadResponse::Complete { data, .. } = read else {
            panic!("not complete")
        };
        assert_eq!(&data[..], b"abcde");
    }
}
