//! HTTP plumbing shared by the rate-limiting layer and the load shedder: the rate-limit
//! headers, the responses the middlewares answer with themselves, and the response body they
//! return.

mod body;
pub(crate) mod chunk;
pub(crate) mod headers;
pub(crate) mod response;

pub use body::ResponseBody;
