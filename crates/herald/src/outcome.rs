//! What an attempt's result means: Herald's classification table (docs/concepts.md, *What Herald
//! guarantees*) and the decision it leads to (delivered, retry at a time, or dead letter).
//! Pure functions only.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

/// How an attempt ended, as seen by the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The receiver answered with a status line.
    Response { status: u16, retry_after: Option<Duration> },
    /// No usable answer.
    Failed(Failure),
}

/// Why an attempt got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The attempt's time budget ran out.
    Timeout,
    /// Connection refused, reset or closed before a response.
    Connection,
    /// The name does not exist (NXDOMAIN / no addresses).
    DnsNotFound,
    /// The resolver could not answer right now.
    DnsTemporary,
    /// TLS handshake or certificate failure.
    Tls,
    /// The destination guard refused the address.
    BlockedDestination,
    /// The response body was longer than Herald reads (announced or sent).
    ResponseTooLarge,
    /// The message cannot fill the endpoint's URL template (a field is missing).
    Template,
    /// The endpoint's transform failed, ran out of time or memory, or asked for a request
    /// Herald may not send.
    Transform,
    /// No OAuth2 token could be had for the endpoint (its token endpoint failed, refused
    /// or was unreachable).
    AuthToken,
    /// The broker refused Herald's credentials (event destinations).
    BrokerAuth,
    /// The stream, subject, queue, topic or exchange does not exist, or nothing is bound
    /// to take the message (event destinations).
    DestinationMissing,
    /// The message is larger than the destination or its broker accepts.
    MessageTooLarge,
    /// The broker asked Herald to slow down, or cannot take messages right now.
    Throttled,
    /// The broker understood the message and refused it for another reason.
    BrokerRefused,
    /// Herald's own failure (render, unreadable payload, panic).
    Internal,
}

/// The classification column of the outcome table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    Delivered,
    Transient,
    Permanent,
    Internal,
}

/// Which failures an endpoint retries (`delivery.retryOn`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum RetryOn {
    /// Timeouts, connection errors, 408, 429, 5xx other than 501, and 3xx.
    #[default]
    Transient,
    /// Only 429 is retried; every other failure is final (marketplace policy).
    RateLimitOnly,
}

/// Classifies a result. A 3xx is a failed attempt (redirects are never
/// followed); it is treated as transient because a redirect is often a maintenance page.
pub fn classify(result: &AttemptResult) -> OutcomeClass {
    match result {
        AttemptResult::Response { status, .. } => match status {
            200..=299 => OutcomeClass::Delivered,
            408 | 429 => OutcomeClass::Transient,
            501 => OutcomeClass::Permanent,
            500..=599 => OutcomeClass::Transient,
            300..=399 => OutcomeClass::Transient,
            _ => OutcomeClass::Permanent,
        },
        AttemptResult::Failed(failure) => match failure {
            Failure::Timeout
            | Failure::Connection
            | Failure::DnsTemporary
            | Failure::ResponseTooLarge
            | Failure::AuthToken
            | Failure::BrokerAuth
            | Failure::Throttled => OutcomeClass::Transient,
            Failure::DnsNotFound
            | Failure::Tls
            | Failure::BlockedDestination
            | Failure::Template
            | Failure::Transform
            | Failure::DestinationMissing
            | Failure::MessageTooLarge
            | Failure::BrokerRefused => OutcomeClass::Permanent,
            Failure::Internal => OutcomeClass::Internal,
        },
    }
}

/// The stable, machine-readable error class stored with a failed attempt.
pub fn error_class(result: &AttemptResult) -> Option<&'static str> {
    match result {
        AttemptResult::Response { status: 200..=299, .. } => None,
        AttemptResult::Response { status: 300..=399, .. } => Some("redirect"),
        AttemptResult::Response { .. } => Some("http_status"),
        AttemptResult::Failed(failure) => Some(match failure {
            Failure::Timeout => "timeout",
            Failure::Connection => "connection",
            Failure::DnsNotFound => "dns_not_found",
            Failure::DnsTemporary => "dns_temporary",
            Failure::Tls => "tls",
            Failure::BlockedDestination => "blocked_destination",
            Failure::ResponseTooLarge => "response_too_large",
            Failure::Template => "template",
            Failure::Transform => "transform_error",
            Failure::AuthToken => "auth_token",
            Failure::BrokerAuth => "broker_auth",
            Failure::DestinationMissing => "destination_missing",
            Failure::MessageTooLarge => "message_too_large",
            Failure::Throttled => "throttled",
            Failure::BrokerRefused => "broker_refused",
            Failure::Internal => "internal",
        }),
    }
}

/// Why a delivery became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// A permanent failure: no retry would help.
    Permanent,
    /// Every attempt the policy allows has been made.
    Exhausted,
}

/// What happens to a delivery after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Delivered,
    Retry { after: Duration },
    Dead(DeadReason),
}

/// The endpoint's retry behaviour, resolved from its settings and the server defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRules {
    pub policy: RetryPolicy,
    pub retry_on: RetryOn,
}

/// Decides the fate of a delivery after its `attempts_made`-th attempt (1 for the first).
pub fn decide(rules: &RetryRules, attempts_made: u32, result: &AttemptResult, rng: &mut impl Rng) -> Decision {
    let retryable = match (classify(result), rules.retry_on) {
        (OutcomeClass::Delivered, _) => return Decision::Delivered,
        (OutcomeClass::Internal, _) => true,
        (OutcomeClass::Transient, RetryOn::Transient) => true,
        (_, RetryOn::RateLimitOnly) => {
            matches!(result, AttemptResult::Response { status: 429, .. } | AttemptResult::Failed(Failure::Throttled))
        }
        (OutcomeClass::Permanent, RetryOn::Transient) => false,
    };
    if !retryable {
        return Decision::Dead(DeadReason::Permanent);
    }
    if attempts_made >= rules.policy.max_attempts() {
        return Decision::Dead(DeadReason::Exhausted);
    }
    let jittered = rules.policy.delay(attempts_made.saturating_sub(1), rng);
    let after = match result {
        AttemptResult::Response { retry_after: Some(asked), .. } => {
            let bounded = (*asked).min(Duration::from_millis(rules.policy.cap_ms()));
            jittered.max(bounded)
        }
        _ => jittered,
    };
    Decision::Retry { after }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Response { status: code, retry_after: None }
    }

    fn rules(retry_on: RetryOn) -> RetryRules {
        RetryRules { policy: RetryPolicy::Schedule { delays_ms: vec![10, 20], jitter_percent: 0 }, retry_on }
    }

    #[test]
    fn classification_matches_the_product_table() {
        use OutcomeClass::*;
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(classify(&status(code)), Delivered, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504, 505, 599, 301, 302, 307] {
            assert_eq!(classify(&status(code)), Transient, "{code}");
        }
        for code in [400, 401, 403, 404, 405, 409, 410, 413, 422, 451, 501, 100, 600, 0] {
            assert_eq!(classify(&status(code)), Permanent, "{code}");
        }
        let failed = |f| classify(&AttemptResult::Failed(f));
        assert_eq!(failed(Failure::Timeout), Transient);
        assert_eq!(failed(Failure::Connection), Transient);
        assert_eq!(failed(Failure::AuthToken), Transient);
        assert_eq!(failed(Failure::DnsTemporary), Transient);
        assert_eq!(failed(Failure::DnsNotFound), Permanent);
        assert_eq!(failed(Failure::Tls), Permanent);
        assert_eq!(failed(Failure::BlockedDestination), Permanent);
        assert_eq!(failed(Failure::Internal), Internal);
    }

    #[test]
    fn error_classes_are_stable_strings() {
        assert_eq!(error_class(&status(200)), None);
        assert_eq!(error_class(&status(503)), Some("http_status"));
        assert_eq!(error_class(&status(302)), Some("redirect"));
        assert_eq!(error_class(&AttemptResult::Failed(Failure::BlockedDestination)), Some("blocked_destination"));
    }

    #[test]
    fn transient_failures_retry_until_attempts_run_out() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = rules(RetryOn::Transient);
        assert_eq!(decide(&r, 1, &status(503), &mut rng), Decision::Retry { after: Duration::from_millis(10) });
        assert_eq!(decide(&r, 2, &status(503), &mut rng), Decision::Retry { after: Duration::from_millis(20) });
        assert_eq!(decide(&r, 3, &status(503), &mut rng), Decision::Dead(DeadReason::Exhausted));
        assert_eq!(decide(&r, 1, &status(200), &mut rng), Decision::Delivered);
    }

    #[test]
    fn permanent_failures_die_after_one_attempt() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = rules(RetryOn::Transient);
        for result in [status(410), status(404), status(501), AttemptResult::Failed(Failure::BlockedDestination)] {
            assert_eq!(decide(&r, 1, &result, &mut rng), Decision::Dead(DeadReason::Permanent));
        }
    }

    #[test]
    fn rate_limit_only_retries_429_and_nothing_else() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = rules(RetryOn::RateLimitOnly);
        assert!(matches!(decide(&r, 1, &status(429), &mut rng), Decision::Retry { .. }));
        for result in [status(500), status(503), status(408), AttemptResult::Failed(Failure::Timeout)] {
            assert_eq!(decide(&r, 1, &result, &mut rng), Decision::Dead(DeadReason::Permanent), "{result:?}");
        }
    }

    #[test]
    fn internal_failures_count_toward_attempts_so_poison_never_loops() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = rules(RetryOn::Transient);
        let poison = AttemptResult::Failed(Failure::Internal);
        assert!(matches!(decide(&r, 1, &poison, &mut rng), Decision::Retry { .. }));
        assert_eq!(decide(&r, 3, &poison, &mut rng), Decision::Dead(DeadReason::Exhausted));
    }

    #[test]
    fn retry_after_is_honoured_but_bounded_by_the_policy_cap() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = rules(RetryOn::Transient);
        let asked = |secs| AttemptResult::Response { status: 429, retry_after: Some(Duration::from_secs(secs)) };
        // The cap of a [10 ms, 20 ms] schedule is 20 ms: a 1 h Retry-After is clamped to it.
        assert_eq!(decide(&r, 1, &asked(3600), &mut rng), Decision::Retry { after: Duration::from_millis(20) });
        let roomy = RetryRules { policy: RetryPolicy::default(), retry_on: RetryOn::Transient };
        match decide(&roomy, 1, &asked(120), &mut rng) {
            Decision::Retry { after } => assert!(after >= Duration::from_secs(120)),
            other => panic!("expected a retry, got {other:?}"),
        }
    }
}
