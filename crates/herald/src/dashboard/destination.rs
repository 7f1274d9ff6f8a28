//! The "deliver to" part of the endpoint settings form: HTTP (the URL field), or an event
//! destination of one of the types below, each with its broker, its place on the broker
//! and write-only credentials. Every type's fields are in the page (the one chosen is
//! shown, by CSS alone); only the chosen type's are sent to the API, which checks them.

use std::collections::HashMap;

use maud::{Markup, html};
use serde_json::{Map, Value, json};

use super::form::Fields;
use crate::api::ApiError;
use crate::destinations::DestinationOut;

/// One field of a type's place on its broker.
struct Place {
    /// The API's name of the field.
    field: &'static str,
    label: &'static str,
    kind: Input,
}

#[derive(PartialEq)]
enum Input {
    Text,
    Number,
    Check,
    /// One of these values, the first the default.
    Choice(&'static [&'static str]),
}

/// A destination type as the form offers it.
struct TypeForm {
    kind: &'static str,
    title: &'static str,
    broker_label: &'static str,
    broker_example: &'static str,
    places: &'static [Place],
    /// What the username and password are called for this type.
    credentials: (&'static str, &'static str),
}

const BROKER: &str = "Broker URL";
const USER_PASSWORD: (&str, &str) = ("Username (optional)", "Password");
/// The Amazon types: an optional service endpoint, and an IAM access key.
const AWS_ENDPOINT: &str = "Service endpoint (optional: the region's public one)";
const ACCESS_KEY: (&str, &str) = ("Access key ID", "Secret access key");
const PARTITION_KEYS: &[&str] = &["application", "channel", "eventId", "messageId"];

const TYPES: &[TypeForm] = &[
    TypeForm {
        kind: "redisStreams",
        title: "Redis Streams",
        broker_label: BROKER,
        credentials: USER_PASSWORD,
        broker_example: "redis://redis.example.com:6379/0",
        places: &[
            Place { field: "stream", label: "Stream", kind: Input::Text },
            Place { field: "createStream", label: "Create the stream if it does not exist", kind: Input::Check },
            Place {
                field: "maxLen",
                label: "Trim the stream to about this many entries (optional)",
                kind: Input::Number,
            },
        ],
    },
    TypeForm {
        kind: "natsJetStream",
        title: "NATS JetStream",
        broker_label: BROKER,
        credentials: USER_PASSWORD,
        broker_example: "nats://nats.example.com:4222",
        places: &[Place { field: "subject", label: "Subject (a JetStream stream must take it)", kind: Input::Text }],
    },
    TypeForm {
        kind: "rabbitmq",
        title: "RabbitMQ",
        broker_label: BROKER,
        credentials: USER_PASSWORD,
        broker_example: "amqps://rabbitmq.example.com:5671/vhost",
        places: &[
            Place { field: "exchange", label: "Exchange (empty: the default exchange)", kind: Input::Text },
            Place {
                field: "routingKey",
                label: "Routing key (the queue's name on the default exchange)",
                kind: Input::Text,
            },
        ],
    },
    TypeForm {
        kind: "kafka",
        title: "Apache Kafka",
        broker_label: "Bootstrap broker URL",
        credentials: ("SASL username (optional)", "SASL password"),
        broker_example: "kafkas://kafka.example.com:9093",
        places: &[
            Place { field: "topic", label: "Topic", kind: Input::Text },
            Place {
                field: "partitionKey",
                label: "Record key (picks the partition)",
                kind: Input::Choice(PARTITION_KEYS),
            },
            Place {
                field: "saslMechanism",
                label: "SASL mechanism",
                kind: Input::Choice(&["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]),
            },
        ],
    },
    TypeForm {
        kind: "sqs",
        title: "Amazon SQS",
        broker_label: "Service endpoint (optional: the queue URL's)",
        credentials: ACCESS_KEY,
        broker_example: "https://sqs.us-east-1.amazonaws.com",
        places: &[
            Place { field: "queueUrl", label: "Queue URL", kind: Input::Text },
            Place { field: "region", label: "Region", kind: Input::Text },
            Place {
                field: "partitionKey",
                label: "Message group of a FIFO queue",
                kind: Input::Choice(PARTITION_KEYS),
            },
        ],
    },
    TypeForm {
        kind: "sns",
        title: "Amazon SNS",
        broker_label: AWS_ENDPOINT,
        credentials: ACCESS_KEY,
        broker_example: "https://sns.us-east-1.amazonaws.com",
        places: &[
            Place { field: "topicArn", label: "Topic ARN", kind: Input::Text },
            Place { field: "region", label: "Region", kind: Input::Text },
            Place {
                field: "partitionKey",
                label: "Message group of a FIFO topic",
                kind: Input::Choice(PARTITION_KEYS),
            },
        ],
    },
    TypeForm {
        kind: "eventBridge",
        title: "Amazon EventBridge",
        broker_label: AWS_ENDPOINT,
        credentials: ACCESS_KEY,
        broker_example: "https://events.us-east-1.amazonaws.com",
        places: &[
            Place { field: "eventBus", label: "Event bus (name or ARN)", kind: Input::Text },
            Place { field: "region", label: "Region", kind: Input::Text },
            Place { field: "source", label: "Source of the events", kind: Input::Text },
        ],
    },
];

/// The destination as the form shows it: the chosen type and the values of its fields
/// (`dest_<type>_<field>`), never a secret.
#[derive(Default, Clone)]
pub struct DestinationDraft {
    /// `http`, or a type's name.
    pub kind: String,
    pub values: HashMap<String, String>,
    /// Whether the stored destination has a password (shown as set, never as a value).
    pub password_set: bool,
}

fn name(kind: &str, field: &str) -> String {
    format!("dest_{kind}_{field}")
}

impl DestinationDraft {
    /// What an endpoint's stored destination shows as.
    pub fn of(shown: Option<DestinationOut>) -> Self {
        let Some(shown) = shown else { return Self { kind: "http".into(), ..Default::default() } };
        let password_set = shown.credentials.as_ref().is_some_and(|c| c.password_set);
        let json = serde_json::to_value(&shown).unwrap_or_default();
        let kind = json["type"].as_str().unwrap_or("http").to_owned();
        let mut values = HashMap::new();
        for (field, value) in json.as_object().into_iter().flatten() {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ => continue,
            };
            values.insert(name(&kind, field), text);
        }
        if let Some(username) = shown.credentials.and_then(|c| c.username) {
            values.insert(name(&kind, "username"), username);
        }
        Self { kind, values, password_set }
    }

    /// What a posted form holds, as typed (after a refusal); passwords are not kept.
    pub fn typed(fields: &Fields) -> Self {
        let kind = fields.get("destination_type").unwrap_or("http").to_owned();
        let values = TYPES
            .iter()
            .flat_map(|t| {
                let places = t.places.iter().map(|p| p.field).chain(["broker", "username"]);
                places.filter_map(|f| Some((name(t.kind, f), fields.get(&name(t.kind, f))?.to_owned())))
            })
            .collect();
        Self { kind, values, password_set: false }
    }
}

/// The form's destination as API fields of `body`: `destination` (null for HTTP); with a
/// destination the URL field is not sent (the endpoint reads back as the broker's URL).
pub fn apply(fields: &Fields, body: &mut Value) -> Result<(), ApiError> {
    let chosen = fields.get("destination_type").unwrap_or("http");
    let Some(form) = TYPES.iter().find(|t| t.kind == chosen) else {
        body["destination"] = Value::Null;
        return Ok(());
    };
    let mut destination = Map::new();
    destination.insert("type".into(), json!(form.kind));
    destination.insert("broker".into(), json!(fields.get(&name(form.kind, "broker")).unwrap_or_default().trim()));
    for place in form.places {
        let given = fields.given(&name(form.kind, place.field));
        let value = match (&place.kind, given) {
            (Input::Check, given) => json!(given == Some("true")),
            (_, None) => continue,
            (Input::Text | Input::Choice(_), Some(text)) => json!(text),
            (Input::Number, Some(n)) => json!(n.parse::<u64>().map_err(|_| {
                ApiError::invalid(&format!("destination.{}", place.field), "must be a whole number")
            })?),
        };
        destination.insert(place.field.into(), value);
    }
    // Write-only: left blank, the stored credentials stay (on the same broker).
    let username = fields.given(&name(form.kind, "username"));
    let password = fields.given(&name(form.kind, "password"));
    if username.is_some() || password.is_some() {
        destination.insert("credentials".into(), json!({"username": username, "password": password}));
    }
    body.as_object_mut().expect("an object").remove("url");
    body["destination"] = Value::Object(destination);
    Ok(())
}

/// The "deliver to" fieldset: the choice, then each type's fields.
pub fn fieldset(draft: &DestinationDraft, problem: impl Fn(&str) -> Markup) -> Markup {
    let chosen = if draft.kind.is_empty() { "http" } else { draft.kind.as_str() };
    let value = |kind: &str, field: &str| draft.values.get(&name(kind, field)).cloned().unwrap_or_default();
    html! {
        fieldset.destination {
            legend { "Deliver to" }
            label for="destination_type" { "Where this endpoint's messages go" }
            select #destination_type name="destination_type" {
                option value="http" selected[chosen == "http"] { "HTTP: a POST to the URL above" }
                @for t in TYPES {
                    option value=(t.kind) selected[chosen == t.kind] { (t.title) " (event destination)" }
                }
            }
            (problem("destination"))
            @for t in TYPES {
                @let mine = chosen == t.kind;
                fieldset class={ "destination-type dest-" (t.kind) } {
                    legend { (t.title) ": the broker, where messages go on it, and how Herald signs in" }
                    @let broker = name(t.kind, "broker");
                    label for=(broker) { (t.broker_label) }
                    input id=(broker) type="text" name=(broker) value=(value(t.kind, "broker"))
                        placeholder=(t.broker_example) spellcheck="false";
                    @if mine { (problem("destination.broker")) }
                    @for place in t.places {
                        @let id = name(t.kind, place.field);
                        @match place.kind {
                            Input::Check => label.check {
                                input id=(id) type="checkbox" name=(id) value="true"
                                    checked[value(t.kind, place.field) == "true"];
                                " " (place.label)
                            },
                            Input::Choice(options) => {
                                label for=(id) { (place.label) }
                                @let current = value(t.kind, place.field);
                                select id=(id) name=(id) {
                                    @for option in options.iter() {
                                        option value=(option) selected[current == *option] { (option) }
                                    }
                                }
                            },
                            _ => {
                                label for=(id) { (place.label) }
                                input id=(id) type=(if place.kind == Input::Number { "number" } else { "text" })
                                    name=(id) value=(value(t.kind, place.field)) spellcheck="false";
                            },
                        }
                        @if mine { (problem(&format!("destination.{}", place.field))) }
                    }
                    @let (user, pass) = (name(t.kind, "username"), name(t.kind, "password"));
                    label for=(user) { (t.credentials.0) }
                    input id=(user) type="text" name=(user) value=(value(t.kind, "username")) autocomplete="off";
                    @if mine { (problem("destination.credentials.username")) }
                    label for=(pass) {
                        (t.credentials.1) " (write-only"
                        @if mine && draft.password_set { "; one is set: leave blank to keep it" }
                        ")"
                    }
                    input id=(pass) type="password" name=(pass) autocomplete="new-password";
                    @if mine { (problem("destination.credentials.password")) (problem("destination.credentials")) }
                }
            }
        }
    }
}
