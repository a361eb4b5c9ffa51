//! Security headers on every answer: no MIME sniffing, no referrer, and on the two pages a
//! Content-Security-Policy that allows only their own inline script and style (by hash, made
//! from the pages as built) and the API of this origin. The review desk can never be framed;
//! the chat page may be, by the sites `webchat.frame_ancestors` names, since it is meant to be
//! embedded.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The policies, made once at start.
pub(super) struct Policies {
    chat: HeaderValue,
    desk: HeaderValue,
}

impl Policies {
    /// `frame_ancestors` is checked when the configuration loads; were it still no valid
    /// header, no site could frame the chat page.
    pub(super) fn new(frame_ancestors: &str) -> Policies {
        let page = |html: &str, ancestors: &str| {
            HeaderValue::from_str(&policy(html, ancestors))
                .or_else(|_| HeaderValue::from_str(&policy(html, "'none'")))
                .unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"))
        };
        Policies {
            chat: page(include_str!("chat.html"), frame_ancestors),
            desk: page(include_str!("desk.html"), "'none'"),
        }
    }
}

pub(super) async fn secure(
    State(policies): State<Arc<Policies>>,
    request: Request,
    next: Next,
) -> Response {
    let page = match request.uri().path() {
        "/" => Some(policies.chat.clone()),
        "/desk" => Some(policies.desk.clone()),
        _ => None,
    };
    let desk = request.uri().path() == "/desk";
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Some(policy) = page {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    if desk {
        headers.insert(
            HeaderName::from_static("x-frame-options"),
            HeaderValue::from_static("DENY"),
        );
    }
    response
}

/// The page's policy: its inline scripts and styles by hash, requests to this origin only.
fn policy(page: &str, frame_ancestors: &str) -> String {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors {frame_ancestors}",
        hashes(page, "script"),
        hashes(page, "style"),
    )
}

/// `'sha256-…'` of every inline `<tag>` block of the page.
fn hashes(page: &str, tag: &str) -> String {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find(&open) {
        let Some(body) = rest[start..].find('>').map(|i| start + i + 1) else {
            break;
        };
        let Some(end) = rest[body..].find(&close).map(|i| body + i) else {
            break;
        };
        let digest = Sha256::digest(&rest.as_bytes()[body..end]);
        out.push(format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        ));
        rest = &rest[end..];
    }
    if out.is_empty() {
        "'none'".to_owned()
    } else {
        out.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_blocks_are_allowed_by_their_hash_and_nothing_else() {
        let page = "<style>p{}</style><script>go()</script>";
        let policy = policy(page, "'none'");
        let script = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(b"go()"));
        assert!(
            policy.contains(&format!("script-src 'sha256-{script}';")),
            "{policy}"
        );
        assert!(policy.contains("frame-ancestors 'none'"));
        assert!(!policy.contains("unsafe"));
    }
}
