pub mod host_container;
pub mod prepared;
