//! WhatsApp webhooks signed as Meta signs them (`X-Hub-Signature-256` over the raw body), for
//! the tests, the benchmarks and the fake Graph API's status callbacks: the one place outside
//! `whatsapp::signature` that signs a body.

use secrecy::SecretString;

/// A POST of `body` to `url`, signed with `app_secret`; the caller adds headers and sends it.
pub fn signed(
    client: &reqwest::Client,
    url: &str,
    app_secret: &str,
    body: impl Into<Vec<u8>>,
) -> reqwest::RequestBuilder {
    let body = body.into();
    client
        .post(url)
        .header("content-type", "application/json")
        .header("x-hub-signature-256", signature(app_secret, &body))
        .body(body)
}

/// The `X-Hub-Signature-256` value Meta sends with `body` for an app with `app_secret`, for
/// tests that set the header themselves (a signature taken apart, or sent with another body).
pub fn signature(app_secret: &str, body: &[u8]) -> String {
    crate::whatsapp::sign(&SecretString::from(app_secret.to_owned()), body)
}
