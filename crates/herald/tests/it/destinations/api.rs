//! The destination as the API sets and shows it: checked at the field (the destination
//! guard judges every broker address), `url` reading back as the broker's, credentials
//! write-only (kept by an update that leaves them out, never carried to another broker),
//! and an SDK's full update that only repeats what it read changes nothing.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;

fn redis(broker: &str) -> Value {
    json!({"type": "redisStreams", "broker": broker, "stream": "orders",
           "credentials": {"username": "herald", "password": "broker-secret"}})
}

/// The `loc` and `msg` of each problem a 422 names.
fn problems(body: &Value) -> Vec<(String, String)> {
    let items = body["detail"].as_array().unwrap_or_else(|| panic!("no detail: {body}"));
    items
        .iter()
        .map(|p| {
            let loc: Vec<&str> = p["loc"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
            (loc.join("."), p["msg"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn a_destination_is_refused_at_its_field() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    for (broker, field, says) in [
        // The test server allows loopback only: any other private address is refused.
        ("redis://10.1.2.3:6379", "body.destination.broker", "destination"),
        ("redis://169.254.169.254:6379", "body.destination.broker", "destination"),
        ("redis://[::ffff:10.1.2.3]:6379", "body.destination.broker", "destination"),
        ("redis://broker.example:25", "body.destination.broker", "port 25"),
        ("redis://u:p@127.0.0.1:6379", "body.destination.broker", "use credentials"),
        ("amqp://127.0.0.1:5672", "body.destination.broker", "redis:// or rediss://"),
        ("redis://127.0.0.1:6379/x", "body.destination.broker", "by number"),
        ("redis://127.0.0.1:6379?db=1", "body.destination.broker", "no query"),
    ] {
        let (status, body) = server.post(&path, json!({"destination": redis(broker)})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{broker}: {body}");
        let found = problems(&body);
        assert!(found.iter().any(|(loc, msg)| loc == field && msg.contains(says)), "{broker}: {found:?}");
    }
    let mut bad = redis("redis://127.0.0.1:6379");
    bad["stream"] = json!("two words");
    bad["credentials"] = json!({"username": "only-a-name"});
    bad["maxMessageBytes"] = json!(0);
    let (status, body) = server.post(&path, json!({"destination": bad})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<String> = problems(&body).into_iter().map(|(loc, _)| loc).collect();
    for field in ["stream", "credentials.password", "maxMessageBytes"] {
        assert!(locs.contains(&format!("body.destination.{field}")), "{field}: {locs:?}");
    }
    let (status, body) =
        server.post(&path, json!({"destination": {"type": "carrierPigeon", "broker": "coop://roof"}})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = server
        .post(&path, json!({"url": "https://hooks.example.com/", "destination": redis("redis://127.0.0.1:6379")}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problems(&body).iter().any(|(loc, msg)| loc == "body.url" && msg.contains("publishes to")), "{body}");
    let postback = json!({"destination": redis("redis://127.0.0.1:6379"), "request": {"method": "GET"}});
    let (status, body) = server.post(&path, postback).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problems(&body).iter().any(|(loc, _)| loc == "body.destination"), "{body}");
    let basic = json!({"destination": redis("redis://127.0.0.1:6379"), "auth": {"type": "basic", "username": "u", "password": "p"}});
    let (status, body) = server.post(&path, basic).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problems(&body).iter().any(|(loc, msg)| loc == "body.destination" && msg.contains("auth")), "{body}");
    let (_, list) = server.get(&path).await;
    assert_eq!(list["data"], json!([]), "nothing refused was stored");
}

#[tokio::test]
async fn reads_show_the_destination_without_its_secrets_and_updates_keep_them() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let created = server.create_endpoint(&app, "", json!({"destination": redis("redis://127.0.0.1:6390/2")})).await;
    let id = created["id"].as_str().unwrap();
    let read_back = "redis://127.0.0.1:6390/2?stream=orders";
    assert_eq!(created["url"], read_back, "{created}");
    let shown = json!({"type": "redisStreams", "broker": "redis://127.0.0.1:6390/2", "stream": "orders",
                       "createStream": false, "credentials": {"username": "herald", "passwordSet": true}});
    assert_eq!(created["destination"], shown);
    let path = format!("/api/v1/app/{app}/endpoint/{id}");
    let (_, read) = server.get(&path).await;
    assert_eq!(read["destination"], shown);
    assert!(!read.to_string().contains("broker-secret"), "{read}");

    // What an SDK does: read, then update with the URL it read and no destination.
    let (status, updated) =
        server.call(Method::PUT, &path, Some(json!({"url": read["url"], "description": "orders stream"}))).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!((updated["destination"].clone(), updated["url"].clone()), (shown.clone(), json!(read_back)));
    // Another stream on the same broker keeps the credentials; another broker does not.
    let mut moved = redis("redis://127.0.0.1:6390/2");
    moved["stream"] = json!("payments");
    moved.as_object_mut().unwrap().remove("credentials");
    let (_, patched) = server.call(Method::PATCH, &path, Some(json!({"destination": moved}))).await;
    assert_eq!(patched["destination"]["credentials"]["passwordSet"], true, "{patched}");
    assert_eq!(patched["url"], "redis://127.0.0.1:6390/2?stream=payments");
    // The credentials as a read shows them (the username alone) keep the password; another
    // username without a password is refused.
    moved["credentials"] = json!({"username": "herald"});
    let (status, patched) = server.call(Method::PATCH, &path, Some(json!({"destination": moved}))).await;
    assert_eq!((status, patched["destination"]["credentials"].clone()), (StatusCode::OK, shown["credentials"].clone()));
    moved["credentials"] = json!({"username": "someone-else"});
    let (status, refused) = server.call(Method::PATCH, &path, Some(json!({"destination": moved}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["detail"][0]["loc"], json!(["body", "destination", "credentials", "password"]), "{refused}");
    moved.as_object_mut().unwrap().remove("credentials");
    moved["broker"] = json!("redis://127.0.0.2:6390");
    let (_, patched) = server.call(Method::PATCH, &path, Some(json!({"destination": moved}))).await;
    assert!(patched["destination"].get("credentials").is_none(), "credentials stay with their broker: {patched}");
    // Back to HTTP: null, with a URL.
    let (status, http) = server
        .call(Method::PATCH, &path, Some(json!({"destination": null, "url": "https://hooks.example.com/"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{http}");
    assert!(http.get("destination").is_none(), "{http}");
    assert_eq!(http["url"], "https://hooks.example.com/");
}

#[tokio::test]
async fn a_portal_token_sets_destinations_of_its_own_application_only() {
    let server = TestServer::start().await;
    let (mine, theirs) = (server.create_app("mine").await, server.create_app("theirs").await);
    let token = server.portal_token(&mine).await;
    let body = json!({"destination": redis("redis://127.0.0.1:6390")});
    let created = server.request_as(&token, Method::POST, &format!("/api/v1/app/{mine}/endpoint")).json(&body);
    assert_eq!(created.send().await.unwrap().status(), StatusCode::CREATED);
    let refused = server.request_as(&token, Method::POST, &format!("/api/v1/app/{theirs}/endpoint")).json(&body);
    let status = refused.send().await.unwrap().status();
    assert!(matches!(status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED), "{status}");
    let (_, list) = server.get(&format!("/api/v1/app/{theirs}/endpoint")).await;
    assert_eq!(list["data"], json!([]));
}

/// The Amazon types: an access key is required, the queue URL, topic ARN, event bus and
/// region are checked at their fields, the service endpoint defaults (the queue URL's
/// origin for SQS, the region's public endpoint otherwise) and passes the guard, and each
/// reads back as its documented URL with the secret key never shown.
#[tokio::test]
async fn amazon_destinations_are_checked_defaulted_and_read_back() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let key = json!({"accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "aws-secret-key"});

    let queue_url = "http://127.0.0.1:4566/123456789012/orders.fifo";
    let sqs = json!({"type": "sqs", "queueUrl": queue_url, "region": "eu-west-1", "credentials": key});
    let (status, created) = server.post(&path, json!({"destination": sqs})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["url"], queue_url, "an SQS destination reads back as its queue URL");
    let expected = json!({"type": "sqs", "broker": "http://127.0.0.1:4566", "queueUrl": queue_url,
                          "region": "eu-west-1", "partitionKey": "application",
                          "credentials": {"username": "AKIAEXAMPLE", "passwordSet": true}});
    assert_eq!(created["destination"], expected);
    assert!(!created.to_string().contains("aws-secret-key"));

    let sns = json!({"type": "sns", "topicArn": "arn:aws:sns:us-east-1:123456789012:orders", "region": "us-east-1",
                     "broker": "http://127.0.0.1:4566", "credentials": key});
    let (status, created) = server.post(&path, json!({"destination": sns})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["url"], "http://127.0.0.1:4566/?topicArn=arn%3Aaws%3Asns%3Aus-east-1%3A123456789012%3Aorders");

    let bus = json!({"type": "eventBridge", "eventBus": "orders", "region": "eu-central-1", "credentials": key});
    let (status, created) = server.post(&path, json!({"destination": bus})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["destination"]["broker"], "https://events.eu-central-1.amazonaws.com");
    assert_eq!(created["destination"]["source"], "herald");
    assert_eq!(created["url"], "https://events.eu-central-1.amazonaws.com/?eventBus=orders");

    for (destination, field) in [
        (
            json!({"type": "sqs", "queueUrl": "http://127.0.0.1:4566/orders", "region": "eu-west-1", "credentials": key}),
            "queueUrl",
        ),
        (json!({"type": "sqs", "queueUrl": queue_url, "region": "Europe", "credentials": key}), "region"),
        (json!({"type": "sqs", "queueUrl": queue_url, "region": "eu-west-1"}), "credentials"),
        (
            json!({"type": "sqs", "queueUrl": "http://10.0.0.1/123456789012/q", "region": "eu-west-1", "credentials": key}),
            "broker",
        ),
        (
            json!({"type": "sns", "topicArn": "orders", "region": "us-east-1", "broker": "http://127.0.0.1:4566",
                "credentials": key}),
            "topicArn",
        ),
        (
            json!({"type": "eventBridge", "eventBus": "orders", "source": "aws.s3", "region": "us-east-1",
                "broker": "http://127.0.0.1:4566", "credentials": key}),
            "source",
        ),
        (
            json!({"type": "eventBridge", "eventBus": "my bus", "region": "us-east-1",
                "broker": "http://127.0.0.1:4566", "credentials": key}),
            "eventBus",
        ),
    ] {
        let (status, body) = server.post(&path, json!({"destination": destination})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {body}");
        let found = problems(&body);
        assert!(found.iter().any(|(loc, _)| *loc == format!("body.destination.{field}")), "{field}: {found:?}");
    }
}

/// A Kafka destination reads back as its bootstrap broker's URL with the topic, shows its
/// partition key and SASL mechanism (defaults: the application, SCRAM-SHA-512) but never
/// the password, and is refused at the field for an illegal topic, an unknown mechanism or
/// a broker URL that is not Kafka's.
#[tokio::test]
async fn kafka_destinations_are_checked_and_read_back() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let credentials = json!({"username": "herald", "password": "kafka-secret"});
    let kafka = json!({"type": "kafka", "broker": "kafkas://127.0.0.1:9093", "topic": "orders.paid",
                       "credentials": credentials});
    let (status, created) = server.post(&path, json!({"destination": kafka})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["url"], "kafkas://127.0.0.1:9093?topic=orders.paid");
    let expected = json!({"type": "kafka", "broker": "kafkas://127.0.0.1:9093", "topic": "orders.paid",
                          "partitionKey": "application", "saslMechanism": "SCRAM-SHA-512",
                          "credentials": {"username": "herald", "passwordSet": true}});
    assert_eq!(created["destination"], expected);
    assert!(!created.to_string().contains("kafka-secret"));

    for (destination, field) in [
        (json!({"type": "kafka", "broker": "kafka://127.0.0.1:9092", "topic": "orders paid"}), "topic"),
        (json!({"type": "kafka", "broker": "http://127.0.0.1:9092", "topic": "orders"}), "broker"),
        (json!({"type": "kafka", "broker": "kafka://127.0.0.1:9092/orders", "topic": "orders"}), "broker"),
        (json!({"type": "kafka", "broker": "kafka://10.0.0.1:9092", "topic": "orders"}), "broker"),
    ] {
        let (status, body) = server.post(&path, json!({"destination": destination})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {body}");
        let found = problems(&body);
        assert!(found.iter().any(|(loc, _)| *loc == format!("body.destination.{field}")), "{field}: {found:?}");
    }
    let unknown = json!({"type": "kafka", "broker": "kafka://127.0.0.1:9092", "topic": "orders",
                         "saslMechanism": "GSSAPI"});
    let (status, body) = server.post(&path, json!({"destination": unknown})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let (_, document) = server.get("/api/v1/openapi.json").await;
    let kinds = document["components"]["schemas"]["DestinationKind"].to_string();
    assert!(kinds.contains("\"kafka\"") && kinds.contains("saslMechanism"), "the served document: {kinds}");
    let mechanisms = document["components"]["schemas"]["SaslMechanism"]["enum"].clone();
    assert_eq!(mechanisms, json!(["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]));
}
