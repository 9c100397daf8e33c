//! The Connect protocol's unary calls (connectrpc.com/docs/protocol), as far as a server of
//! `POST /<package>.<Service>/<Method>` needs it: the request body is the bare message as
//! `application/proto` or `application/json`, the answer the bare message in the same codec
//! with status 200, a failure a status and `{"code", "message"}` as JSON. Compressed requests
//! are refused (clients compress only when told to), answers are never compressed.

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ApiError;
use crate::server::ApiState;

/// The media types of the two codecs.
const PROTO: &str = "application/proto";
const JSON: &str = "application/json";

/// How a call's messages are encoded: as its request's `Content-Type` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Proto,
    Json,
}

impl Codec {
    fn of(headers: &HeaderMap) -> Result<Codec, ConnectError> {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let media_type = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match media_type.as_str() {
            PROTO => Ok(Codec::Proto),
            JSON => Ok(Codec::Json),
            _ => Err(ConnectError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                code: "unimplemented",
                message: format!(
                    "unsupported Content-Type {content_type:?}: send Connect unary requests as \
                     {PROTO} or {JSON}"
                ),
                retry_after: None,
            }),
        }
    }

    fn decode<T: Message + DeserializeOwned + Default>(
        self,
        body: &[u8],
    ) -> Result<T, ConnectError> {
        match self {
            Codec::Proto => T::decode(body).map_err(|e| {
                ConnectError::invalid_argument(format!("the request is not a valid message: {e}"))
            }),
            // An empty body is the empty message in both codecs.
            Codec::Json if body.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
            Codec::Json => serde_json::from_slice(body).map_err(|e| {
                ConnectError::invalid_argument(format!(
                    "the request is not valid JSON for its message: {e}"
                ))
            }),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => PROTO,
            Codec::Json => JSON,
        }
    }
}

/// A message a method answers with, in either codec.
pub trait Reply: Send + 'static {
    fn to_proto(&self) -> Vec<u8>;
    fn to_json(&self) -> Vec<u8>;
}

impl<T: Message + Serialize + Send + 'static> Reply for T {
    fn to_proto(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    fn to_json(&self) -> Vec<u8> {
        // Messages of strings, numbers and lists always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A failed call: its HTTP status, its Connect code and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `Retry-After` in seconds, when waiting helps (an overloaded route class).
    pub retry_after: Option<u64>,
}

impl ConnectError {
    pub fn invalid_argument(message: impl Into<String>) -> ConnectError {
        ConnectError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_argument",
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn unimplemented(message: impl Into<String>) -> ConnectError {
        ConnectError {
            status: StatusCode::NOT_IMPLEMENTED,
            code: "unimplemented",
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<ApiError> for ConnectError {
    fn from(error: ApiError) -> ConnectError {
        let status = error.status();
        let code = match status {
            StatusCode::BAD_REQUEST => "invalid_argument",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "internal",
        };
        let retry_after = error.retry_after();
        if status.is_server_error() && retry_after.is_none() {
            tracing::error!(code, "{error}");
        }
        ConnectError {
            status,
            code,
            message: error.to_string(),
            retry_after,
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.code, "message": self.message});
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(JSON))],
            body.to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// The route of one unary method, `POST`: decodes the request in the codec its `Content-Type`
/// names, runs `method` and encodes its answer in the same codec.
pub fn post<Req, Rep, F, Fut>(method: F) -> MethodRouter<ApiState>
where
    Req: Message + DeserializeOwned + Default + Send + 'static,
    Rep: Reply,
    F: Fn(ApiState, Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Rep, ConnectError>> + Send + 'static,
{
    routing::post(
        move |State(state): State<ApiState>, headers: HeaderMap, body: Bytes| {
            let method = method.clone();
            async move {
                let call = async {
                    let codec = Codec::of(&headers)?;
                    if let Some(encoding) = headers
                        .get(header::CONTENT_ENCODING)
                        .and_then(|v| v.to_str().ok())
                        .filter(|e| !e.eq_ignore_ascii_case("identity"))
                    {
                        return Err(ConnectError::unimplemented(format!(
                            "unsupported Content-Encoding {encoding:?}: send requests uncompressed"
                        )));
                    }
                    let reply = method(state, codec.decode(&body)?).await?;
                    let body = match codec {
                        Codec::Proto => reply.to_proto(),
                        Codec::Json => reply.to_json(),
                    };
                    Ok::<_, ConnectError>(
                        (
                            [(
                                header::CONTENT_TYPE,
                                HeaderValue::from_static(codec.content_type()),
                            )],
                            body,
                        )
                            .into_response(),
                    )
                };
                call.await.unwrap_or_else(ConnectError::into_response)
            }
        },
    )
}
