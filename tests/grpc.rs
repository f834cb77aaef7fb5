//! The layer in a real tonic server, called by a real tonic client over TCP.

#[path = "../examples/greeter/mod.rs"]
mod greeter;

use std::time::Duration;

use greeter::{GreeterClient, GreeterServer, HelloRequest};
use tollgate::key::{GrpcMethod, Header};
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request};

async fn serve(layer: RateLimitLayer) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(GreeterServer)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

/// The number the metadata `key` of `status` holds.
fn number(status: &tonic::Status, key: &str) -> u64 {
    let value = status.metadata().get(key);
    let text = value
        .unwrap_or_else(|| panic!("no {key}"))
        .to_str()
        .unwrap();
    text.parse().unwrap()
}

fn hello(name: &str, api_key: &str) -> Request<HelloRequest> {
    let mut req = Request::new(HelloRequest { name: name.into() });
    req.metadata_mut()
        .insert("x-api-key", api_key.parse().unwrap());
    req
}

#[tokio::test]
async fn a_tonic_client_gets_resource_exhausted() {
    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let layer = RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap());
    let url = serve(layer).await;
    let mut client = GreeterClient::connect(url).await.unwrap();

    for _ in 0..2 {
        let reply = client.say_hello(hello("ada", "k1")).await.unwrap();
        assert_eq!(reply.get_ref().message, "hello, ada");
        // admitted responses carry the rate-limit fields as metadata
        assert!(reply.metadata().get("ratelimit").is_some());
    }
    let status = client.say_hello(hello("ada", "k1")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("2/min"), "{}", status.message());
    let retry: u64 = number(&status, "retry-after");
    // the sliding window frees the second request somewhere in the next minute
    assert!((1..=120).contains(&retry), "{retry}");
    // and the same wait for gRPC clients' retry policies (gRFC A6), in milliseconds
    let pushback: u64 = number(&status, "grpc-retry-pushback-ms");
    assert!(
        pushback > (retry - 1) * 1000 && pushback <= retry * 1000,
        "{pushback} ms against retry-after: {retry}"
    );

    // another API key is its own client
    let reply = client.say_hello(hello("bob", "k2")).await.unwrap();
    assert_eq!(reply.get_ref().message, "hello, bob");
}

/// Calls with two API keys from one peer, under `2/min` keyed by the peer: both spend its
/// budget.
#[cfg(feature = "tonic")]
async fn two_keys_spend_one_budget(client: &mut GreeterClient) {
    for (key, left) in [("a", "1"), ("b", "0")] {
        let reply = client.say_hello(hello("x", key)).await.unwrap();
        let state = reply.metadata().get("ratelimit").unwrap().to_str().unwrap();
        assert!(
            state.starts_with(&format!("\"2/min\";r={left};t=")),
            "{state}"
        );
    }
}

/// The peer address, as tonic records it, keys requests by default: with the default
/// features, a tonic server needs no key extractor.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn the_peer_address_is_the_default_key() {
    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let url = serve(RateLimitLayer::new(limiter)).await;
    let mut client = GreeterClient::connect(url).await.unwrap();
    two_keys_spend_one_budget(&mut client).await;
    let status = client.say_hello(hello("x", "c")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let retry: u64 = number(&status, "retry-after");
    let state = status
        .metadata()
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap();
    let t: u64 = state.rsplit("t=").next().unwrap().parse().unwrap();
    assert!(state.starts_with("\"2/min\";r=0;t="), "{state}");
    assert!(t <= retry, "{state} against retry-after: {retry}");
}

/// A tonic server over its own TLS (`tls_config`) records the TCP peer as over plain TCP,
/// beside the TLS connection's info: it needs no setup either.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn over_tls_the_peer_address_is_the_default_key() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};

    // a test authority and a certificate it signed for localhost and 127.0.0.1, valid until
    // 2126 (made with `openssl req -x509` for the authority, `openssl x509 -req` with
    // `subjectAltName=DNS:localhost,IP:127.0.0.1` and `basicConstraints=CA:FALSE` for the
    // server; P-256 keys)
    let ca = Certificate::from_pem(include_str!("common/tls/ca.pem"));
    let identity = Identity::from_pem(
        include_str!("common/tls/server.pem"),
        include_str!("common/tls/server.key"),
    );
    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tls_config(ServerTlsConfig::new().identity(identity))
            .unwrap()
            .layer(RateLimitLayer::new(limiter))
            .add_service(GreeterServer)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca)
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = GreeterClient::new(channel);
    // other API keys, one peer: one budget (without the peer's address, every call would
    // fail for want of a key)
    two_keys_spend_one_budget(&mut client).await;
    let status = client.say_hello(hello("x", "c")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

/// The method as the key: one budget per gRPC method, whoever calls.
#[tokio::test]
async fn per_method_limits() {
    let limiter = Limiter::new(MemoryStore::new(), "3/min".parse().unwrap());
    let url = serve(RateLimitLayer::new(limiter).key(GrpcMethod)).await;
    let mut client = GreeterClient::connect(url).await.unwrap();
    for key in ["a", "b", "c"] {
        client.say_hello(hello("x", key)).await.unwrap();
    }
    let status = client.say_hello(hello("x", "d")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn a_missing_key_is_a_grpc_status_too() {
    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let layer = RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap());
    let url = serve(layer).await;
    let mut client = GreeterClient::connect(url).await.unwrap();
    let req = Request::new(HelloRequest { name: "eve".into() });
    let status = tokio::time::timeout(Duration::from_secs(5), client.say_hello(req))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("no rate-limit key"));
}

/// A refused grpc-web call is answered in grpc-web's own content type (a grpc-web client
/// reads the status only from such a response), with the wait as gRPC's pushback; a limited
/// status of the application's choice maps to a code clients treat as a limit.
#[tokio::test]
async fn grpc_web_calls_are_refused_in_their_own_type() {
    use http::header::CONTENT_TYPE;
    use http::StatusCode;
    use tower::{service_fn, Layer, ServiceExt};

    let call = |content_type: &'static str| {
        http::Request::post("/greeter.Greeter/SayHello")
            .header(CONTENT_TYPE, content_type)
            .header("x-api-key", "k")
            .body(http_body_util::Full::<bytes::Bytes>::default())
            .unwrap()
    };
    let ok = service_fn(|_| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(
            http_body_util::Full::<bytes::Bytes>::default(),
        ))
    });
    for (status, code) in [
        (StatusCode::TOO_MANY_REQUESTS, "8"),
        (StatusCode::from_u16(420).unwrap(), "8"),
        (StatusCode::SERVICE_UNAVAILABLE, "14"),
        (StatusCode::BAD_GATEWAY, "14"),
    ] {
        let limiter = Limiter::new(MemoryStore::new(), "1/min".parse().unwrap());
        let layer = RateLimitLayer::new(limiter)
            .key(Header::named("x-api-key").unwrap())
            .limited_status(status);
        let svc = layer.layer(ok);
        let first = svc.clone().oneshot(call("application/grpc-web")).await;
        assert_eq!(first.unwrap().status(), StatusCode::OK);
        for content_type in [
            "application/grpc-web",
            "application/grpc-web-text+proto",
            "application/grpc",
        ] {
            let res = svc.clone().oneshot(call(content_type)).await.unwrap();
            let h = res.headers();
            assert_eq!(res.status(), StatusCode::OK, "{content_type}");
            assert_eq!(h["grpc-status"], code, "{status} {content_type}");
            assert_eq!(h[CONTENT_TYPE], content_type);
            let pushback: u64 = h["grpc-retry-pushback-ms"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            // (the rolling window frees the next call within the minute and a sub-window)
            assert!((1..=120_000).contains(&pushback), "{pushback}");
        }
    }
}

/// A tonic client whose channel is limited by a `KeyedRateLimitLayer` reads a refusal as
/// `RESOURCE_EXHAUSTED`, the wait in its metadata, and can still reach the `RateLimited`.
#[tokio::test]
async fn a_keyed_layer_around_a_channel_refuses_with_resource_exhausted() {
    use tollgate::{KeyedRateLimitLayer, RateLimited};
    use tower::ServiceBuilder;

    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let url = serve(RateLimitLayer::new(Limiter::new(
        MemoryStore::new(),
        "100/s".parse().unwrap(),
    )))
    .await;
    let channel = tonic::transport::Endpoint::new(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let limited = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(
            limiter,
            |_: &http::Request<tonic::body::Body>| "outbound:greeter".into(),
        ))
        .service(channel);
    let mut grpc = tonic::client::Grpc::new(limited);
    let path = http::uri::PathAndQuery::from_static("/hello.Greeter/SayHello");
    let mut call = async || {
        grpc.ready().await.unwrap();
        let req = Request::new(greeter::HelloRequest { name: "ada".into() });
        let codec =
            tonic_prost::ProstCodec::<greeter::HelloRequest, greeter::HelloReply>::default();
        grpc.unary(req, path.clone(), codec).await
    };
    for _ in 0..2 {
        assert_eq!(call().await.unwrap().get_ref().message, "hello, ada");
    }
    let status = call().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("2/min"), "{}", status.message());
    let retry: u64 = number(&status, "retry-after");
    assert!((1..=120).contains(&retry), "{retry}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
    let source = std::error::Error::source(&status).expect("the refusal");
    assert!(source.downcast_ref::<RateLimited>().is_some(), "{source:?}");
}
