//! A tonic server limited per API key (sent as metadata), and a tonic client that sees
//! `RESOURCE_EXHAUSTED` once it goes over.
//!
//! ```text
//! cargo run --example tonic
//! ```

mod greeter;

use greeter::{GreeterClient, GreeterServer, HelloRequest};
use tollgate::key::Header;
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tonic::transport::server::TcpIncoming;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::new(MemoryStore::new(), "3/s, 20/min".parse()?);
    let layer = RateLimitLayer::new(limiter).key(Header::named("x-api-key")?);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(GreeterServer)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
    for i in 1..=5 {
        let mut req = tonic::Request::new(HelloRequest {
            name: format!("call {i}"),
        });
        req.metadata_mut().insert("x-api-key", "demo-key".parse()?);
        match client.say_hello(req).await {
            Ok(reply) => println!("{i}: {}", reply.get_ref().message),
            Err(status) => println!("{i}: {:?}: {}", status.code(), status.message()),
        }
    }
    Ok(())
}
