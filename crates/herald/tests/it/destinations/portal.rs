//! The portal's endpoint form in a real headless Chromium: a customer picks a destination
//! type, is refused a broker the destination guard forbids (the reason next to the broker
//! field, nothing created), adds a destination of each type with a password that is never
//! shown again, and a test event from each endpoint's page reaches its broker (or Amazon
//! service). Every page passes the accessibility audit.

use serde_json::{Value, json};

use super::amazon::{Amazon, EventBridge, Sns, Sqs};
use super::kafka::{self, Kafka};
use super::nats_jetstream::{self, Nats};
use super::rabbitmq::{self, Rabbit};
use super::redis_streams::{self, Redis};
use super::scenarios::Fixture;
use crate::support::browser::Browser;
use crate::support::{TestServer, eventually};

/// Chooses `kind` in the "deliver to" select and fills in the fields, by name.
async fn fill(browser: &Browser, kind: &str, fields: &[(&str, &str)]) {
    browser.run(&format!("document.getElementById('destination_type').value = '{kind}';")).await;
    for (field, value) in fields {
        let id = format!("dest_{kind}_{field}");
        browser.run(&format!("document.getElementById('{id}').value = '{value}';")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_adds_a_destination_of_each_type_in_the_portal() {
    let (redis, nats, rabbit) = (Redis::start().await, Nats::start().await, Rabbit::start().await);
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let browser = Browser::start().await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    browser.goto(access["url"].as_str().unwrap()).await;
    let portal = browser.until_url("the portal", |url| url.ends_with(&format!("/app/{app}"))).await;
    browser.click("#add-endpoint").await;
    assert_eq!(
        browser.run("return getComputedStyle(document.querySelector('.dest-redisStreams')).display;").await,
        "none"
    );

    fill(&browser, "redisStreams", &[("broker", "redis://10.9.8.7:6379"), ("stream", "orders")]).await;
    assert_eq!(
        browser.run("return getComputedStyle(document.querySelector('.dest-redisStreams')).display;").await,
        "block"
    );
    assert_eq!(browser.run("return getComputedStyle(document.querySelector('.http-url')).display;").await, "none");
    browser.click("form.settings button[type=submit]").await;
    let reason = browser.text(".dest-redisStreams .field-error").await;
    assert!(reason.contains("10.9.8.7"), "the guard's reason at the broker field: {reason}");
    let (_, endpoints) = server.get(&format!("/api/v1/app/{app}/endpoint")).await;
    assert_eq!(endpoints["data"], json!([]), "nothing created");
    browser.audit_refusal("portal-destination-refused", 422).await;

    let address = format!("redis://127.0.0.1:{}/0", redis.broker_port());
    fill(&browser, "redisStreams", &[("broker", &address), ("password", redis_streams::PASSWORD)]).await;
    browser.run("document.getElementById('dest_redisStreams_createStream').checked = true;").await;
    let expected = json!({"type": "redisStreams", "broker": address, "stream": "orders", "createStream": true,
                          "credentials": {"passwordSet": true}});
    add(&browser, &server, &app, expected, redis_streams::PASSWORD, &redis).await;

    browser.goto(&portal).await;
    browser.click("#add-endpoint").await;
    let address = format!("nats://127.0.0.1:{}", nats.broker_port());
    nats.make_stream("orders", None).await;
    let credentials = [("username", nats_jetstream::USER), ("password", nats_jetstream::PASSWORD)];
    fill(
        &browser,
        "natsJetStream",
        &[&[("broker", address.as_str()), ("subject", "orders")][..], &credentials].concat(),
    )
    .await;
    let expected = json!({"type": "natsJetStream", "broker": address, "subject": "orders",
                          "credentials": {"username": "herald", "passwordSet": true}});
    add(&browser, &server, &app, expected, nats_jetstream::PASSWORD, &nats).await;

    browser.goto(&portal).await;
    browser.click("#add-endpoint").await;
    let address = format!("amqp://127.0.0.1:{}/", rabbit.broker_port());
    rabbit.destination("orders", true).await;
    let credentials = [("username", rabbitmq::USER), ("password", rabbitmq::PASSWORD)];
    fill(&browser, "rabbitmq", &[&[("broker", address.as_str()), ("routingKey", "orders")][..], &credentials].concat())
        .await;
    let expected = json!({"type": "rabbitmq", "broker": address, "exchange": "", "routingKey": "orders",
                          "credentials": {"username": "herald", "passwordSet": true}});
    add(&browser, &server, &app, expected, rabbitmq::PASSWORD, &rabbit).await;
    add_kafka(&browser, &server, &app, &portal).await;
    add_amazon(&browser, &server, &app, &portal).await;
}

/// A Kafka topic, keyed by channel, signed in with SCRAM-SHA-256.
async fn add_kafka(browser: &Browser, server: &TestServer, app: &str, portal: &str) {
    let kafka = Kafka::start().await;
    browser.goto(portal).await;
    browser.click("#add-endpoint").await;
    let address = kafka.destination("orders", true).await["broker"].as_str().unwrap().to_owned();
    let fields =
        [("broker", address.as_str()), ("topic", "orders"), ("username", kafka::USER), ("password", kafka::PASSWORD)];
    fill(browser, "kafka", &fields).await;
    browser.run("document.getElementById('dest_kafka_partitionKey').value = 'channel';").await;
    browser.run("document.getElementById('dest_kafka_saslMechanism').value = 'SCRAM-SHA-256';").await;
    let expected = json!({"type": "kafka", "broker": address, "topic": "orders", "partitionKey": "channel",
                          "saslMechanism": "SCRAM-SHA-256", "credentials": {"username": "herald", "passwordSet": true}});
    add(browser, server, app, expected, kafka::PASSWORD, &kafka).await;
}

/// An SQS queue (its endpoint left to default to the queue URL's origin), an SNS topic and
/// an EventBridge bus, each signed in with an access key.
async fn add_amazon(browser: &Browser, server: &TestServer, app: &str, portal: &str) {
    let (sqs, sns, bus) =
        (Amazon::<Sqs>::start().await, Amazon::<Sns>::start().await, Amazon::<EventBridge>::start().await);

    browser.goto(portal).await;
    browser.click("#add-endpoint").await;
    let queue_url = sqs.destination("orders", true).await["queueUrl"].clone();
    let (key, secret) = sqs.key().clone();
    let fields =
        [("queueUrl", queue_url.as_str().unwrap()), ("region", "us-east-1"), ("username", &key), ("password", &secret)];
    fill(browser, "sqs", &fields).await;
    browser.run("document.getElementById('dest_sqs_partitionKey').value = 'channel';").await;
    let expected = json!({"type": "sqs", "broker": sqs.endpoint(), "queueUrl": queue_url, "region": "us-east-1",
                          "partitionKey": "channel", "credentials": {"username": key, "passwordSet": true}});
    add(browser, server, app, expected, &secret, &sqs).await;

    browser.goto(portal).await;
    browser.click("#add-endpoint").await;
    let topic_arn = sns.destination("orders", true).await["topicArn"].as_str().unwrap().to_owned();
    let (key, secret) = sns.key().clone();
    let endpoint = sns.endpoint();
    let fields = [
        ("broker", endpoint.as_str()),
        ("topicArn", &topic_arn),
        ("region", "us-east-1"),
        ("username", &key),
        ("password", &secret),
    ];
    fill(browser, "sns", &fields).await;
    let expected = json!({"type": "sns", "broker": endpoint, "topicArn": topic_arn, "region": "us-east-1",
                          "partitionKey": "application", "credentials": {"username": key, "passwordSet": true}});
    add(browser, server, app, expected, &secret, &sns).await;

    browser.goto(portal).await;
    browser.click("#add-endpoint").await;
    bus.destination("orders", true).await;
    let (key, secret) = bus.key().clone();
    let endpoint = bus.endpoint();
    let fields = [
        ("broker", endpoint.as_str()),
        ("eventBus", "orders"),
        ("region", "us-east-1"),
        ("source", "shop"),
        ("username", &key),
        ("password", &secret),
    ];
    fill(browser, "eventBridge", &fields).await;
    let expected = json!({"type": "eventBridge", "broker": endpoint, "eventBus": "orders", "region": "us-east-1",
                          "source": "shop", "credentials": {"username": key, "passwordSet": true}});
    add(browser, server, app, expected, &secret, &bus).await;
}

/// Saves the filled-in form and checks the endpoint's destination is `expected`, the
/// password is not in the page, and (saved again, the password left blank and so kept) a
/// test event from the endpoint's page reaches the broker.
async fn add<F: Fixture>(
    browser: &Browser,
    server: &TestServer,
    app: &str,
    expected: Value,
    password: &str,
    broker: &F,
) {
    let kind = expected["type"].as_str().unwrap();
    browser.click("form.settings button[type=submit]").await;
    let page = browser.until_url("the endpoint's page", |u| u.contains("/endpoint/ep_")).await;
    let ep = page.rsplit('/').next().unwrap().to_owned();
    let (_, endpoint) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(endpoint["destination"], expected, "{endpoint}");
    let html = browser.run("return document.documentElement.outerHTML;").await.to_string();
    assert!(!html.contains(password), "the password is never shown again");
    assert_eq!(browser.run("return document.getElementById('destination_type').value;").await, kind);
    assert!(browser.text(&format!(".dest-{kind}")).await.contains("one is set"), "the page says a password is set");
    browser.audit(&format!("portal-destination-{kind}")).await;

    browser.click("form.settings button[type=submit]").await;
    browser.until_url("the endpoint's page again", |u| u.ends_with(&ep)).await;
    browser.click("#test-event button").await;
    let entries = eventually("the test event at the broker", || async {
        let entries = broker.read_all("orders").await;
        (!entries.is_empty()).then_some(entries)
    })
    .await;
    assert!(entries[0].verifies(&server.secret(app, &ep).await));
}
