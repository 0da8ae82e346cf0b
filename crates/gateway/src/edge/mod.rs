//! The edge: what every connection and request meets before a route: the accept loop and its
//! connection bound (`server`), request bodies bounded in size and time (`request_body`),
//! writes that must progress (`write_deadline`), the allowed origins (`cors`) and the `Host`
//! allow-list against DNS rebinding (`hosts`).

pub mod cors;
pub mod hosts;
pub mod request_body;
pub mod server;
mod write_deadline;
