//! How a page looks and where it may be shown. A customer's pages carry their application's
//! brand (over the server's) and may be framed by the origins the operator allows
//! (`portal.frame_ancestors`); the operator's pages carry the server's brand and are never
//! framed. Every dashboard response gets its security headers here ([`headers`]): the
//! Content-Security-Policy is built per response from the page's [`Look`], so the brand's
//! style sheet (by its hash) and logo origin are the only additions to a strict policy.
//!
//! A portal inside another site's frame is a third-party context: its cookies are sent only
//! if they are `SameSite=None; Secure; Partitioned` (kept apart per embedding site). Such
//! cookies are set for requests the browser marks as framed (`Sec-Fetch-Dest: iframe`) when
//! embedding is configured ([`embedded`]); everything else keeps `SameSite=Strict`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::api::{AppState, Principal};
use crate::brand::{Brand, style_hash};

/// A page's brand and whether it may be framed.
#[derive(Debug, Clone, Default)]
pub struct Look {
    pub brand: Brand,
    /// A customer's page (or one shown before sign-in): framed where the operator allows.
    pub embeddable: bool,
}

impl Look {
    /// The look of pages shown to `principal`: an application's brand for its customer.
    pub async fn of(state: &AppState, principal: &Principal) -> Self {
        let server = &state.settings.portal.brand;
        match principal {
            Principal::Admin => Self { brand: server.clone(), embeddable: false },
            Principal::App { app_id, .. } => {
                let app = state.catalog.app(app_id.as_str()).await.ok().flatten();
                let brand = app.and_then(|a| a.portal_brand.clone()).map_or_else(|| server.clone(), |b| b.over(server));
                Self { brand, embeddable: true }
            }
        }
    }

    /// The look of pages before sign-in (the sign-in page, the portal entry, errors).
    pub fn public(state: &AppState) -> Self {
        Self { brand: state.settings.portal.brand.clone(), embeddable: true }
    }
}

/// Whether this request comes from inside a frame of an embedding site, and embedding is
/// configured at all.
pub fn embedded(state: &AppState, headers: &HeaderMap) -> bool {
    !state.settings.portal.frame_ancestors.is_empty()
        && headers.get("sec-fetch-dest").is_some_and(|v| v.as_bytes() == b"iframe")
}

/// Sets every dashboard response's security headers, its Content-Security-Policy from the
/// [`Look`] the handler attached (a response without one is treated as public).
pub async fn headers(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let look = response.extensions_mut().remove::<Look>().unwrap_or_else(|| Look::public(&state));
    let policy = policy(&look, &state.settings.portal.frame_ancestors);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&policy).expect("policy is ASCII"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Pages show payloads and, when revealed, signing secrets: never kept by a cache.
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    // Nothing leaves for other sites; same-origin posts keep their `Origin` (under
    // `no-referrer` a browser sends `Origin: null`, which the sign-in refuses).
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    response
}

/// Nothing inline runs and nothing loads from elsewhere, but the brand's own style sheet
/// (by hash) and logo (by origin); framed only by the allowed origins, and only when the
/// page is a customer's.
fn policy(look: &Look, frame_ancestors: &[String]) -> String {
    let style = look.brand.style().map(|s| format!(" {}", style_hash(&s))).unwrap_or_default();
    let logo = look.brand.logo_origin().map(|o| format!(" {o}")).unwrap_or_default();
    let framers =
        if look.embeddable && !frame_ancestors.is_empty() { frame_ancestors.join(" ") } else { "'none'".into() };
    format!(
        "default-src 'none'; style-src 'self'{style}; script-src 'self'; img-src 'self'{logo}; form-action 'self'; \
         frame-ancestors {framers}; base-uri 'none'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_customer_pages_are_framed_and_only_by_the_allowed_origins() {
        let allowed = vec!["https://app.example.com".to_owned(), "https://*.example.org".to_owned()];
        let customer = Look { brand: Brand::default(), embeddable: true };
        let operator = Look { brand: Brand::default(), embeddable: false };
        assert!(policy(&customer, &allowed).contains("frame-ancestors https://app.example.com https://*.example.org;"));
        assert!(policy(&operator, &allowed).contains("frame-ancestors 'none';"));
        assert!(policy(&customer, &[]).contains("frame-ancestors 'none';"));
    }

    #[test]
    fn a_brand_adds_its_style_hash_and_logo_origin_only() {
        let brand = Brand {
            accent_color: Some("#0a7cff".into()),
            logo_url: Some("https://cdn.acme.example/logo.svg".into()),
            ..Default::default()
        };
        let style = brand.style().unwrap();
        let p = policy(&Look { brand, embeddable: true }, &[]);
        assert!(p.contains(&format!("style-src 'self' {};", style_hash(&style))), "{p}");
        assert!(p.contains("img-src 'self' https://cdn.acme.example;"), "{p}");
        assert!(policy(&Look::default(), &[]).contains("style-src 'self'; script-src 'self'; img-src 'self';"));
    }
}
