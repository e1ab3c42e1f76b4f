//! Operations run end to end on the lab's nodes by the controller and agents, with the
//! first-party plugins: a test binary of its own, apart from `plugins`, so that no test there
//! reads a lab node root (`certs`) while a renewal here rewrites one.

mod e2e_openrc;
mod e2e_renew;
mod e2e_upgrade;
