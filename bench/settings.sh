# bench/settings.sh: the bench clusters' postgresql.conf lines (sourced by
# bench/run.sh and bench/before-cluster.sh, so that both sides of the access
# section run on the same settings): a small production server's, the
# library preloaded (event counts on, as in production).
bench_settings=(
	"max_connections = 100"
	"shared_buffers = 1GB"
	"max_wal_size = 8GB"
	"checkpoint_timeout = 30min"
	"synchronous_commit = on"
	"fsync = on"
	"shared_preload_libraries = 'durable_ledger'"
)
