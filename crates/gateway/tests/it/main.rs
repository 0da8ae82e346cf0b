//! Integration tests of the gateway (one test binary).

mod browser;
mod chaos;
mod cluster;
mod cluster_real;
mod conformance;
mod crash;
mod docs;
mod edge;
mod fake_kernel;
mod fuzz;
mod fuzz_body;
mod fuzz_cwd;
mod http_surface;
mod identity;
mod ids;
mod limits;
mod load;
mod process;
mod protocol;
mod real_kernel;
mod reattach;
mod stall;
mod support;
mod telemetry;
mod wire;
mod workspace;
