//! The `[otel]` section: where traces are exported and how many are kept. The standard
//! `OTEL_*` environment variables set the same keys, over the file and under flags, so a
//! Herald configured like any other OpenTelemetry program behaves like one.

use std::fmt;
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;
use toml::Value;

/// The standard variables Herald reads, and the `otel.*` key each sets.
const ENV_KEYS: &[(&str, &str)] = &[
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "exporter_otlp_endpoint"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "exporter_otlp_traces_endpoint"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "exporter_otlp_headers"),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "exporter_otlp_traces_headers"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "exporter_otlp_protocol"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "exporter_otlp_traces_protocol"),
    ("OTEL_TRACES_SAMPLER", "traces_sampler"),
    ("OTEL_TRACES_SAMPLER_ARG", "traces_sampler_arg"),
    ("OTEL_SERVICE_NAME", "service_name"),
    ("OTEL_BSP_SCHEDULE_DELAY", "bsp_schedule_delay"),
    ("OTEL_SDK_DISABLED", "sdk_disabled"),
];

/// The `otel.*` keys the standard variables set, as (key path, value).
pub(super) fn env_overrides(env: &[(String, String)]) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for (name, raw) in env {
        let Some((_, key)) = ENV_KEYS.iter().find(|(var, _)| var == name) else { continue };
        let value = match *key {
            "traces_sampler_arg" if raw.trim().is_empty() => continue,
            "traces_sampler_arg" => Value::Float(
                raw.trim().parse().map_err(|_| anyhow::anyhow!("{name}: {raw:?} is not a number between 0 and 1"))?,
            ),
            "bsp_schedule_delay" => Value::Integer(
                raw.trim().parse().map_err(|_| anyhow::anyhow!("{name}: {raw:?} is not a number of milliseconds"))?,
            ),
            "sdk_disabled" => Value::Boolean(raw.trim().eq_ignore_ascii_case("true")),
            _ => Value::String(raw.clone()),
        };
        out.push((format!("otel.{key}"), value));
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOtel {
    exporter_otlp_endpoint: String,
    exporter_otlp_traces_endpoint: String,
    exporter_otlp_headers: String,
    exporter_otlp_traces_headers: String,
    exporter_otlp_protocol: String,
    exporter_otlp_traces_protocol: String,
    traces_sampler: String,
    traces_sampler_arg: f64,
    service_name: String,
    bsp_schedule_delay: u64,
    sdk_disabled: bool,
}

/// Tracing as configured: `export` is `None` when it is off.
#[derive(Debug, Clone)]
pub struct OtelConfig {
    pub export: Option<OtlpExport>,
    pub sampler: SamplerChoice,
    pub service_name: String,
}

impl Default for OtelConfig {
    fn default() -> Self {
        Self { export: None, sampler: SamplerChoice::ParentBasedAlwaysOn, service_name: "herald".into() }
    }
}

/// Where and how spans are sent.
#[derive(Clone)]
pub struct OtlpExport {
    /// The full URL of the traces endpoint.
    pub url: http::Uri,
    /// Sent with every export (often a collector's API key).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    pub schedule_delay: Duration,
}

impl fmt::Debug for OtlpExport {
    /// Header values are credentials: only their names are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("OtlpExport")
            .field("url", &self.url)
            .field("headers", &names)
            .field("schedule_delay", &self.schedule_delay)
            .finish()
    }
}

/// The samplers of the OpenTelemetry specification (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio(f64),
}

impl RawOtel {
    /// With no collector (or `sdk_disabled`), tracing is off and the other keys are not
    /// looked at: a machine-wide OpenTelemetry setup for other programs does not stop Herald.
    pub(super) fn validate(self) -> anyhow::Result<OtelConfig> {
        let service_name = match self.service_name.trim() {
            "" => "herald".to_owned(),
            name => name.to_owned(),
        };
        let url = traces_url(&self.exporter_otlp_traces_endpoint, &self.exporter_otlp_endpoint)?;
        let (Some(url), false) = (url, self.sdk_disabled) else {
            return Ok(OtelConfig { service_name, ..OtelConfig::default() });
        };
        let protocol = match self.exporter_otlp_traces_protocol.trim() {
            "" => self.exporter_otlp_protocol.trim(),
            per_signal => per_signal,
        };
        if !protocol.is_empty() && protocol != "http/protobuf" {
            bail!(
                "otel.exporter_otlp_protocol (OTEL_EXPORTER_OTLP_PROTOCOL) {protocol:?}: Herald exports http/protobuf only"
            );
        }
        let mut headers = parse_headers(&self.exporter_otlp_headers)?;
        headers.extend(parse_headers(&self.exporter_otlp_traces_headers)?);
        let schedule_delay = Duration::from_millis(self.bsp_schedule_delay.max(1));
        let sampler = sampler(&self.traces_sampler, self.traces_sampler_arg)?;
        Ok(OtelConfig { export: Some(OtlpExport { url, headers, schedule_delay }), sampler, service_name })
    }
}

fn sampler(name: &str, ratio: f64) -> anyhow::Result<SamplerChoice> {
    if !(0.0..=1.0).contains(&ratio) {
        bail!("otel.traces_sampler_arg must be between 0 and 1, not {ratio}");
    }
    Ok(match name.trim() {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::TraceIdRatio(ratio),
        "parentbased_always_on" | "" => SamplerChoice::ParentBasedAlwaysOn,
        "parentbased_always_off" => SamplerChoice::ParentBasedAlwaysOff,
        "parentbased_traceidratio" => SamplerChoice::ParentBasedTraceIdRatio(ratio),
        other => bail!(
            "otel.traces_sampler (OTEL_TRACES_SAMPLER) {other:?} is not one of always_on, always_off, \
             traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
        ),
    })
}

/// The traces URL: the per-signal endpoint as given, else `<endpoint>/v1/traces`.
fn traces_url(traces_endpoint: &str, endpoint: &str) -> anyhow::Result<Option<http::Uri>> {
    let (key, text) = match (traces_endpoint.trim(), endpoint.trim()) {
        ("", "") => return Ok(None),
        ("", base) => ("otel.exporter_otlp_endpoint", format!("{}/v1/traces", base.trim_end_matches('/'))),
        (full, _) => ("otel.exporter_otlp_traces_endpoint", full.to_owned()),
    };
    // Not quoted in errors: a URL may carry credentials.
    let url: http::Uri = text.parse().map_err(|_| anyhow::anyhow!("{key} is not a URL"))?;
    if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
        bail!("{key} is not an http(s) URL");
    }
    if url.authority().is_some_and(|a| a.as_str().contains('@')) {
        bail!("{key} has user info; put the collector's credentials in otel.exporter_otlp_headers");
    }
    Ok(Some(url))
}

/// `name=value,name2=value2` with percent-encoded values (the OTLP exporter format).
fn parse_headers(text: &str) -> anyhow::Result<Vec<(http::HeaderName, http::HeaderValue)>> {
    let mut headers = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let refused = || anyhow::anyhow!("otel.exporter_otlp_headers: an entry is not name=value");
        let (name, value) = pair.split_once('=').ok_or_else(refused)?;
        let name: http::HeaderName = name.trim().parse().map_err(|_| refused())?;
        let value = percent_encoding::percent_decode_str(value.trim()).decode_utf8().map_err(|_| refused())?;
        // The value is a credential: never quoted in an error. Visible ASCII only.
        let value = http::HeaderValue::from_str(&value).map_err(|_| refused())?;
        value.to_str().map_err(|_| refused())?;
        headers.push((name, value));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawOtel {
        RawOtel {
            exporter_otlp_endpoint: String::new(),
            exporter_otlp_traces_endpoint: String::new(),
            exporter_otlp_headers: String::new(),
            exporter_otlp_traces_headers: String::new(),
            exporter_otlp_protocol: "http/protobuf".into(),
            exporter_otlp_traces_protocol: String::new(),
            traces_sampler: "parentbased_always_on".into(),
            traces_sampler_arg: 1.0,
            service_name: "herald".into(),
            bsp_schedule_delay: 5000,
            sdk_disabled: false,
        }
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert!(raw().validate().unwrap().export.is_none());
        let disabled = RawOtel { exporter_otlp_endpoint: "http://c:4318".into(), sdk_disabled: true, ..raw() };
        assert!(disabled.validate().unwrap().export.is_none());
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_and_the_traces_endpoint_is_used_as_given() {
        let base = RawOtel { exporter_otlp_endpoint: "http://c:4318/".into(), ..raw() };
        assert_eq!(base.validate().unwrap().export.unwrap().url, "http://c:4318/v1/traces");
        let both = RawOtel {
            exporter_otlp_endpoint: "http://c:4318".into(),
            exporter_otlp_traces_endpoint: "https://t.example/otlp".into(),
            ..raw()
        };
        assert_eq!(both.validate().unwrap().export.unwrap().url, "https://t.example/otlp");
        let bad = RawOtel { exporter_otlp_endpoint: "ftp://c".into(), ..raw() };
        assert!(bad.validate().unwrap_err().to_string().contains("exporter_otlp_endpoint"));
    }

    #[test]
    fn headers_are_decoded_and_never_shown() {
        let config = RawOtel {
            exporter_otlp_endpoint: "http://c:4318".into(),
            exporter_otlp_headers: "api-key=s%3Dcret, x-team = core".into(),
            ..raw()
        };
        let export = config.validate().unwrap().export.unwrap();
        assert_eq!(export.headers[0].1, "s=cret");
        assert_eq!(export.headers[1].0, "x-team");
        assert!(!format!("{export:?}").contains("cret"));
        let bad =
            RawOtel { exporter_otlp_endpoint: "http://c".into(), exporter_otlp_headers: "novalue".into(), ..raw() };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn samplers_and_protocols_are_checked_when_tracing_is_on() {
        let on = || RawOtel { exporter_otlp_endpoint: "http://c:4318".into(), ..raw() };
        let ratio = RawOtel { traces_sampler: "traceidratio".into(), traces_sampler_arg: 0.01, ..on() };
        assert_eq!(ratio.validate().unwrap().sampler, SamplerChoice::TraceIdRatio(0.01));
        assert!(RawOtel { traces_sampler: "sometimes".into(), ..on() }.validate().is_err());
        assert!(RawOtel { traces_sampler_arg: 2.0, ..on() }.validate().is_err());
        assert!(RawOtel { exporter_otlp_protocol: "grpc".into(), ..on() }.validate().is_err());
        let per_signal = RawOtel {
            exporter_otlp_protocol: "grpc".into(),
            exporter_otlp_traces_protocol: "http/protobuf".into(),
            ..on()
        };
        assert!(per_signal.validate().is_ok(), "the per-signal protocol wins");
        let elsewhere = RawOtel { exporter_otlp_protocol: "grpc".into(), traces_sampler: "xray".into(), ..raw() };
        assert!(elsewhere.validate().unwrap().export.is_none(), "off: another program's settings do not matter");
        let userinfo = RawOtel { exporter_otlp_endpoint: "https://u:p@c:4318".into(), ..raw() };
        assert!(!userinfo.validate().unwrap_err().to_string().contains("u:p"));
    }

    #[test]
    fn standard_variables_set_the_keys() {
        let env: Vec<(String, String)> = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SDK_DISABLED", "TRUE"),
            ("OTEL_UNRELATED", "x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let set = env_overrides(&env).unwrap();
        assert_eq!(set.len(), 4);
        assert_eq!(set[1], ("otel.traces_sampler_arg".into(), Value::Float(0.25)));
        assert_eq!(set[2], ("otel.bsp_schedule_delay".into(), Value::Integer(100)));
        assert_eq!(set[3], ("otel.sdk_disabled".into(), Value::Boolean(true)));
        let bad = vec![("OTEL_TRACES_SAMPLER_ARG".to_string(), "lots".to_string())];
        assert!(env_overrides(&bad).is_err());
    }
}
