use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use tower::{service_fn, ServiceExt};

use super::*;
use crate::http::response::SHED_MESSAGE;
use crate::{Clock, ManualClock};
use http::header::CONTENT_TYPE;

type Res = Response<Full<Bytes>>;

async fn ok(_req: Request<()>) -> Result<Res, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

/// `layer` over a service that answers `/charge` once `released` is true, and the rest at
/// once.
fn holding_charges(
    layer: &UtilizationShedLayer,
    released: tokio::sync::watch::Receiver<bool>,
) -> impl Service<
    Request<()>,
    Response = Response<ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    tower_layer::Layer::layer(
        layer,
        service_fn(move |req: Request<()>| {
            let mut released = released.clone();
            async move {
                if req.uri().path() == "/charge" {
                    let _ = released.wait_for(|r| *r).await;
                }
                ok(req).await
            }
        }),
    )
}

/// A shedder at full utilization for 150 s: shedding everything but critical traffic.
fn overloaded() -> UtilizationShedder {
    let clock = ManualClock::new(0);
    let shedder = UtilizationShedder::new(ShedConfig::default(), || 1.0)
        .clock(Clock::Manual(clock.clone()))
        .seed(5);
    for _ in 0..150 {
        shedder.update(1.0);
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(shedder.amount(), 1.0);
    shedder
}

fn critical_path(req: &RequestView<'_>) -> Priority {
    if req.uri.path() == "/charge" {
        Priority::Critical
    } else {
        Priority::by_method(req)
    }
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

#[tokio::test]
async fn shed_http_request_gets_503_with_retry_after() {
    let layer = UtilizationShedLayer::new(overloaded())
        .classify(critical_path)
        .retry_after(Duration::from_millis(2500));
    let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
    let res = svc.clone().oneshot(get("/list")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[RETRY_AFTER], "3");
    assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"server overloaded: request shed; retry later\n");

    // Writes too, at amount 1.
    let post = Request::post("/update").body(()).unwrap();
    let res = svc.clone().oneshot(post).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn shed_grpc_request_gets_unavailable() {
    let layer = UtilizationShedLayer::new(overloaded());
    let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
    let req = Request::post("/greeter.Greeter/SayHello")
        .header(CONTENT_TYPE, "application/grpc+proto")
        .body(())
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "14");
    assert_eq!(res.headers()["grpc-message"], SHED_MESSAGE);
    // in the call's own type, and the wait as gRPC's pushback rather than `Retry-After`
    assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc+proto");
    assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1000");
    assert!(res.headers().get("retry-after").is_none());
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
}

#[tokio::test]
async fn critical_requests_pass() {
    let layer = UtilizationShedLayer::new(overloaded()).classify(critical_path);
    let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
    for _ in 0..200 {
        let res = svc.clone().oneshot(get("/charge")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
    }
}

#[tokio::test]
async fn nothing_is_shed_at_rest() {
    let layer = UtilizationShedLayer::in_flight(10);
    let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
    for _ in 0..200 {
        let res = svc.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(layer.shedder().in_flight_counter().unwrap().current(), 0);
}

/// A shedder made with `new` from an `InFlight` is counted by the layer as one made with
/// `in_flight` is: otherwise its utilization would stay 0, and nothing would ever be shed.
#[tokio::test]
async fn an_in_flight_source_is_counted_by_the_layer() {
    let counter = InFlight::new(4);
    let layer = UtilizationShedLayer::new(UtilizationShedder::new(
        ShedConfig::default(),
        counter.clone(),
    ));
    let (release, released) = tokio::sync::watch::channel(false);
    let svc = holding_charges(&layer, released);
    let call = tokio::spawn(svc.oneshot(get("/charge")));
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while counter.current() != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the request in flight is counted");
    release.send(true).unwrap();
    assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(counter.current(), 0);
}

#[tokio::test]
async fn in_flight_is_counted_until_the_response_body_ends() {
    let clock = ManualClock::new(0);
    let shedder = UtilizationShedder::in_flight(ShedConfig::default(), 2)
        .clock(Clock::Manual(clock.clone()))
        .seed(9);
    let layer = UtilizationShedLayer::new(shedder).classify(critical_path);
    let counter = layer.shedder().in_flight_counter().unwrap().clone();
    let (release, released) = tokio::sync::watch::channel(false);
    let svc = holding_charges(&layer, released);

    // Two slow critical requests fill the capacity.
    let a = tokio::spawn(svc.clone().oneshot(get("/charge")));
    let b = svc
        .clone()
        .ready_oneshot()
        .await
        .unwrap()
        .call(get("/charge"));
    while counter.current() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(counter.current(), 2);

    // Full utilization for 150 s: other requests are shed, and not counted.
    let mut shed = 0;
    for _ in 0..150 {
        let res = svc.clone().oneshot(get("/list")).await.unwrap();
        shed += usize::from(res.status() == StatusCode::SERVICE_UNAVAILABLE);
        clock.advance(Duration::from_secs(1));
    }
    assert!((40..=80).contains(&shed), "{shed}");
    assert_eq!(counter.current(), 2);
    let res = svc.clone().oneshot(get("/list")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A dropped response future leaves the count; a completed one once its body ends.
    drop(b);
    assert_eq!(counter.current(), 1);
    release.send(true).unwrap();
    let res = a.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(counter.current(), 1, "the body is still to be sent");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty());
    assert_eq!(counter.current(), 0);
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    let layer = UtilizationShedLayer::in_flight(1);
    assert_eq!(layer.retry_after, "1");
    assert_eq!(layer.clone().retry_after(Duration::ZERO).retry_after, "1");
    assert_eq!(
        layer
            .clone()
            .retry_after(Duration::from_secs(30))
            .retry_after,
        "30"
    );
    assert_eq!(
        layer.retry_after(Duration::from_millis(30_001)).retry_after,
        "31"
    );
}

#[tokio::test]
async fn shed_requests_get_problem_details_when_asked() {
    let layer = UtilizationShedLayer::new(overloaded()).problem_details(true);
    let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
    let res = svc.clone().oneshot(get("/list")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[RETRY_AFTER], "1");
    assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        concat!(
            r#"{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","#,
            r#""title":"Temporary Reduced Capacity","status":503,"#,
            r#""detail":"server overloaded: request shed; retry later"}"#,
            "\n"
        )
    );
    // gRPC clients still read UNAVAILABLE
    let grpc = Request::post("/pkg.Svc/Call")
        .header(CONTENT_TYPE, "application/grpc")
        .body(())
        .unwrap();
    let res = svc.oneshot(grpc).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "14");
}
