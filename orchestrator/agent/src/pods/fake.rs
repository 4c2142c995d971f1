//! A fake kubelet for tests: a gRPC server over HTTP/2 (hyper) on a unix socket in a
//! temporary folder, answering `v1.PodResourcesLister/List` as told, and able to hang,
//! answer an error status, answer garbage or not speak HTTP/2 at all.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;

use super::grpc::frame;
use super::proto::{ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources};

/// What the fake does with the next call.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Answers with this.
    Answer(ListPodResourcesResponse),
    /// Never answers.
    Hang,
    /// Answers a gRPC error status in the trailers (after headers saying 200).
    Status(u32, &'static str),
    /// Answers an error status in the headers alone (a trailers-only answer).
    TrailersOnly(u32),
    /// Answers 200 and `grpc-status: 0` around bytes that are not a gRPC message.
    Garbage,
    /// Answers a well-framed message that is not protobuf.
    NotProtobuf,
    /// Writes bytes that are not HTTP/2 and closes the connection.
    NotHttp2,
}

/// A resource and the ids of its devices.
pub type Devices<'a> = (&'a str, &'a [&'a str]);

/// A pod, its containers and their devices: `(container, [(resource, [ids])])`.
pub fn pod(ns: &str, name: &str, containers: &[(&str, &[Devices])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: containers
            .iter()
            .map(|(c, devs)| ContainerResources {
                name: (*c).into(),
                devices: devs
                    .iter()
                    .map(|(r, ids)| ContainerDevices {
                        resource_name: (*r).into(),
                        device_ids: ids.iter().map(|i| (*i).to_string()).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

pub fn answer(pods: Vec<PodResources>) -> Mode {
    Mode::Answer(ListPodResourcesResponse {
        pod_resources: pods,
    })
}

pub struct FakeKubelet {
    pub socket: PathBuf,
    mode: Arc<Mutex<Mode>>,
    /// Calls that arrived as a gRPC client sends them (path, content-type, te, an
    /// empty framed request).
    well_formed: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

impl FakeKubelet {
    pub fn start(mode: Mode) -> FakeKubelet {
        let dir = tempfile::tempdir().expect("tmp");
        let socket = dir.path().join("kubelet.sock");
        let mode = Arc::new(Mutex::new(mode));
        let (well_formed, calls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = {
            let _in = rt.enter();
            tokio::net::UnixListener::bind(&socket).expect("bind")
        };
        let (m, w, c) = (mode.clone(), well_formed.clone(), calls.clone());
        std::thread::spawn(move || {
            rt.block_on(async move {
                loop {
                    let stream = tokio::select! {
                        s = listener.accept() => match s {
                            Ok((s, _)) => s,
                            Err(_) => continue,
                        },
                        _ = &mut stopped => return,
                    };
                    let now = m.lock().expect("mode").clone();
                    if let Mode::NotHttp2 = now {
                        let mut stream = stream;
                        tokio::spawn(async move {
                            let _ = stream
                                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nno")
                                .await;
                            let _ = stream.shutdown().await;
                        });
                        continue;
                    }
                    let (m, w, c) = (m.clone(), w.clone(), c.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            serve(req, m.clone(), w.clone(), c.clone())
                        });
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        });
        FakeKubelet {
            socket,
            mode,
            well_formed,
            calls,
            _stop: stop,
            _dir: dir,
        }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn well_formed(&self) -> u64 {
        self.well_formed.load(Ordering::SeqCst)
    }
}

/// A body of given frames (data, then trailers).
pub struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }
}

fn trailers(code: u32, message: &str) -> Frame<Bytes> {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", code.into());
    if !message.is_empty() {
        t.insert("grpc-message", message.parse().expect("header value"));
    }
    Frame::trailers(t)
}

fn grpc(frames: Vec<Frame<Bytes>>) -> Response<Frames> {
    let mut r = Response::new(Frames(frames.into()));
    r.headers_mut()
        .insert("content-type", "application/grpc".parse().expect("value"));
    r
}

async fn serve(
    req: Request<Incoming>,
    mode: Arc<Mutex<Mode>>,
    well_formed: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
) -> Result<Response<Frames>, Infallible> {
    use http_body_util::BodyExt;
    calls.fetch_add(1, Ordering::SeqCst);
    let ok = req.uri().path() == super::LIST
        && req.method() == hyper::Method::POST
        && req.headers().get("content-type").map(|v| v.as_bytes()) == Some(b"application/grpc")
        && req.headers().get("te").map(|v| v.as_bytes()) == Some(b"trailers");
    let path_ok = req.uri().path() == super::LIST;
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if ok && body.as_ref() == [0, 0, 0, 0, 0] {
        well_formed.fetch_add(1, Ordering::SeqCst);
    }
    if !path_ok {
        return Ok(grpc(vec![trailers(12, "unknown method")]));
    }
    let now = mode.lock().expect("mode").clone();
    Ok(match now {
        Mode::Answer(a) => grpc(vec![Frame::data(Bytes::from(frame(&a))), trailers(0, "")]),
        Mode::Hang => std::future::pending().await,
        Mode::Status(code, message) => grpc(vec![trailers(code, message)]),
        Mode::TrailersOnly(code) => {
            let mut r = grpc(vec![]);
            r.headers_mut().insert("grpc-status", code.into());
            r
        }
        Mode::Garbage => grpc(vec![
            Frame::data(Bytes::from_static(b"this is no gRPC message")),
            trailers(0, ""),
        ]),
        Mode::NotProtobuf => grpc(vec![
            Frame::data(Bytes::from_static(&[0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff])),
            trailers(0, ""),
        ]),
        Mode::NotHttp2 => unreachable!("answered at accept"),
    })
}
