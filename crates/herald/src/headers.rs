//! Rules about the headers an endpoint carries, shared by everything that reads or writes
//! them (validation, the catalog, the sandbox, delivery, the API's listings): which names
//! Herald keeps for itself, and which values are never shown.

/// Header names endpoint headers cannot use: those Herald sets itself, hop-by-hop and
/// framing headers, headers that name a host or route (they would let a receiver's settings
/// steer proxies and virtual hosts), and the rest of the names Svix refuses (caching and
/// content metadata).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "user-agent",
    "content-type",
    "content-length",
    "content-encoding",
    "content-language",
    "content-location",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "trailers",
    "upgrade",
    "expect",
    "age",
    "cache-control",
    "clear-site-data",
    "expires",
    "pragma",
    "warning",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-host",
    "x-original-host",
];

/// Prefixes endpoint headers cannot use: Herald's and Svix's own (`webhook-*`, `svix-*`,
/// `herald-*`), and those cloud load balancers and CDNs reserve, as Svix refuses them.
const RESERVED_PREFIXES: &[&str] = &[
    "webhook-", "svix-", "x-svix-", "herald-", "x-amz-", "x-amzn-", "x-google", "x-goog-", "x-gfe", "x-azure-", "x-fd-",
];

/// Whether an endpoint may not set this header (name in lower case).
pub fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADERS.contains(&name) || RESERVED_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// Headers whose values are never shown, only their names (the API's header listing, the
/// transform simulation), and never given to filters and transforms.
pub fn is_sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(name.as_str(), "authorization" | "proxy-authorization" | "cookie" | "x-api-key" | "api-key")
        || ["secret", "token", "password"].iter().any(|word| name.contains(word))
}
