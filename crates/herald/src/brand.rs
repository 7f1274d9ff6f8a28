//! The portal's brand: the name, logo, accent colour and theme an operator shows their
//! customers. Set per server (`[portal]` settings) and overridable per application (the
//! application's `portalBrand`, admin only); each field falls back on its own. Validated
//! where it is set, so what the dashboard renders is always a plain name, an https image
//! URL and a `#rrggbb` colour.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Light or dark pages, or whatever the viewer's system prefers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Theme {
    #[default]
    Light,
    Dark,
    Auto,
}

impl Theme {
    pub fn name(self) -> &'static str {
        match self {
            Self::Light => "light",
            Self::Dark => "dark",
            Self::Auto => "auto",
        }
    }
}

/// A brand as given: every field optional (absent: the level above decides).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Brand {
    /// Shown in the header and the page titles instead of "Herald" (at most 100 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An https URL of a logo image, shown in the header (at most 2,048 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logo_url: Option<String>,
    /// The header's and buttons' colour, `#rrggbb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accent_color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theme: Option<Theme>,
}

/// The most characters of a brand name.
const MAX_NAME: usize = 100;
const MAX_LOGO_URL: usize = 2048;

impl Brand {
    /// Problems as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = vec![];
        if let Some(name) = &self.name
            && (name.trim().is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control))
        {
            problems.push(("name", format!("must be 1 to {MAX_NAME} characters, without control characters")));
        }
        if let Some(url) = &self.logo_url
            && let Err(why) = logo_origin(url)
        {
            problems.push(("logoUrl", why));
        }
        if let Some(color) = &self.accent_color
            && parse_color(color).is_none()
        {
            problems.push(("accentColor", "must be a colour in the form #rrggbb".to_owned()));
        }
        problems
    }

    /// This brand with `fallback`'s fields where it has none.
    pub fn over(&self, fallback: &Brand) -> Brand {
        Brand {
            name: self.name.clone().or_else(|| fallback.name.clone()),
            logo_url: self.logo_url.clone().or_else(|| fallback.logo_url.clone()),
            accent_color: self.accent_color.clone().or_else(|| fallback.accent_color.clone()),
            theme: self.theme.or(fallback.theme),
        }
    }

    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or("Herald")
    }

    /// The origin the logo loads from (for the page's `img-src`), when there is a logo.
    pub fn logo_origin(&self) -> Option<String> {
        self.logo_url.as_deref().and_then(|u| logo_origin(u).ok())
    }

    /// The style sheet that applies the accent colour (with a text colour readable on it),
    /// or nothing for Herald's own colours.
    pub fn style(&self) -> Option<String> {
        let (r, g, b) = parse_color(self.accent_color.as_deref()?)?;
        let on_accent = if luminance(r, g, b) > 0.18 { "#111418" } else { "#ffffff" };
        Some(format!(":root{{--accent:#{r:02x}{g:02x}{b:02x};--on-accent:{on_accent}}}"))
    }
}

/// The `'sha256-…'` source that lets exactly this inline style sheet apply under the
/// pages' Content-Security-Policy.
pub fn style_hash(style: &str) -> String {
    use base64::Engine;
    let digest = Sha256::digest(style.as_bytes());
    format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest))
}

/// The logo URL's origin, if it is an absolute https URL without credentials.
fn logo_origin(raw: &str) -> Result<String, String> {
    if raw.len() > MAX_LOGO_URL {
        return Err(format!("must be at most {MAX_LOGO_URL} bytes"));
    }
    let url = url::Url::parse(raw).map_err(|e| format!("is not a URL: {e}"))?;
    if url.scheme() != "https" {
        return Err("must be an https URL".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() || url.host().is_none() {
        return Err("must name a host, without user info".to_owned());
    }
    Ok(url.origin().ascii_serialization())
}

fn parse_color(raw: &str) -> Option<(u8, u8, u8)> {
    let hex = raw.strip_prefix('#')?;
    if hex.len() != 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let channel = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).ok();
    Some((channel(0)?, channel(2)?, channel(4)?))
}

/// WCAG relative luminance of an sRGB colour.
fn luminance(r: u8, g: u8, b: u8) -> f64 {
    let linear = |c: u8| {
        let c = f64::from(c) / 255.0;
        if c <= 0.039_28 { c / 12.92 } else { ((c + 0.055) / 1.055).powf(2.4) }
    };
    0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_values_pass() {
        let brand = Brand {
            name: Some("Acme Webhooks".into()),
            logo_url: Some("https://cdn.acme.example/logo.svg".into()),
            accent_color: Some("#0a7cff".into()),
            theme: Some(Theme::Dark),
        };
        assert!(brand.problems().is_empty());
        assert_eq!(brand.logo_origin().as_deref(), Some("https://cdn.acme.example"));
        let bad = Brand {
            name: Some("\u{7}".into()),
            logo_url: Some("http://cdn.example/logo.png".into()),
            accent_color: Some("red; background: url(x)".into()),
            theme: None,
        };
        let fields: Vec<&str> = bad.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, ["name", "logoUrl", "accentColor"]);
        let creds = Brand { logo_url: Some("https://u:p@cdn.example/l.png".into()), ..Default::default() };
        assert_eq!(creds.problems().len(), 1);
    }

    #[test]
    fn an_application_overrides_field_by_field_and_text_stays_readable() {
        let server = Brand { name: Some("Acme".into()), accent_color: Some("#ffee00".into()), ..Default::default() };
        let app = Brand { accent_color: Some("#102030".into()), ..Default::default() };
        let merged = app.over(&server);
        assert_eq!((merged.display_name(), merged.accent_color.as_deref()), ("Acme", Some("#102030")));
        assert_eq!(merged.style().unwrap(), ":root{--accent:#102030;--on-accent:#ffffff}");
        assert!(server.style().unwrap().ends_with("--on-accent:#111418}"), "dark text on a light accent");
        assert_eq!(Brand::default().style(), None);
        assert!(style_hash("a").starts_with("'sha256-") && style_hash("a") != style_hash("b"));
    }
}
