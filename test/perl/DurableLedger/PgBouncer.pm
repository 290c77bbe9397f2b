# DurableLedger::PgBouncer: Debian's PgBouncer in front of a TAP test cluster,
# for the tests that go through a real transaction pooler (test/t/02?_pooler_*).
#
#   my $bouncer = DurableLedger::PgBouncer->start($node,
#       users => ['worker'],                 # the auth_file (auth_type = trust),
#                                            # with the admin user (postgres)
#       pool_mode => 'transaction',          # the default
#       pool_size => 3,                      # default_pool_size: fewer server
#                                            # connections than clients
#       settings => { ... });                # more pgbouncer.ini settings
#   $bouncer->connstr('postgres')            # libpq DSN through the pooler
#   $bouncer->safe_psql('postgres', $sql)    # like the node's, through the pooler
#   $bouncer->psql('postgres', $sql, ...)    # (also background_psql, poll_query_until;
#                                            # user => NAME connects as another role)
#   $bouncer->admin('SHOW SERVERS')          # the admin console: rows, hashes by column
#   $bouncer->servers('postgres')            # the server connections of a database's pools
#   $bouncer->wait_for_no_clients('postgres')
#   $bouncer->stop                           # also done at the end of the test
#
# PgBouncer listens on 127.0.0.1 at a free port (no Unix socket of its own) and
# reaches the cluster through the cluster's Unix socket, so the cluster needs
# no TCP.  It runs in the foreground under IPC::Run as the user that runs the
# tests (TAP tests run as the cluster's user; PgBouncer, like PostgreSQL,
# refuses root), writes its log to pgbouncer.log in a temporary directory of
# the test ($bouncer->logfile), and is stopped at the end of the test, however
# the test ends.
package DurableLedger::PgBouncer;

use strict;
use warnings;
use Carp;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my @running;    # stopped by the END block if a test dies before it stops them

# The pgbouncer binary: $PGBOUNCER, else PATH, else where Debian puts it.
sub binary
{
	return $ENV{PGBOUNCER} if $ENV{PGBOUNCER};
	for my $dir (split(/:/, $ENV{PATH} // ''), '/usr/sbin', '/usr/bin')
	{
		return "$dir/pgbouncer" if $dir ne '' && -x "$dir/pgbouncer";
	}
	croak "pgbouncer is not installed (test/install-deps.sh installs Debian's package)";
}

sub start
{
	my ($class, $node, %opts) = @_;
	my @users = @{ $opts{users} // ['postgres'] };
	my $self = bless {
		node => $node,
		host => '127.0.0.1',
		port => PostgreSQL::Test::Cluster::get_free_port(),
		dir => PostgreSQL::Test::Utils::tempdir('pgbouncer'),
		pool_mode => $opts{pool_mode} // 'transaction',
		pool_size => $opts{pool_size} // 3,
		user => $opts{user} // 'postgres',
	}, $class;

	my $dir = $self->{dir};
	my %listed;
	open(my $users, '>', "$dir/userlist.txt") or croak "userlist.txt: $!";
	print $users qq{"$_" ""\n} for grep { !$listed{$_}++ } ($self->{user}, @users);
	close($users);

	my %settings = (
		listen_addr => $self->{host},
		listen_port => $self->{port},
		unix_socket_dir => '',
		auth_type => 'trust',
		auth_file => "$dir/userlist.txt",
		admin_users => $self->{user},
		pool_mode => $self->{pool_mode},
		default_pool_size => $self->{pool_size},
		min_pool_size => 0,
		reserve_pool_size => 0,
		max_client_conn => 500,
		pidfile => "$dir/pgbouncer.pid",
		# clients (psycopg, pgbench) may send this at startup
		ignore_startup_parameters => 'extra_float_digits',
		%{ $opts{settings} // {} });
	open(my $ini, '>', "$dir/pgbouncer.ini") or croak "pgbouncer.ini: $!";
	# every database name is passed through to the cluster, over its Unix socket
	printf $ini "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n",
	  $node->host, $node->port;
	print $ini "$_ = $settings{$_}\n" for sort keys %settings;
	close($ini);

	# in the foreground it logs to stderr: to a file (a pipe nobody reads
	# would fill up and stop it)
	$self->{harness} = IPC::Run::start([ binary(), "$dir/pgbouncer.ini" ],
		'<', \undef, '>', "$dir/pgbouncer.log", '2>&1');
	push @running, $self;

	# up when its admin console answers (which opens no server connection:
	# the pools start empty)
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (1)
	{
		last if ($self->_admin('SHOW VERSION'))[0];
		my $said = -f "$dir/pgbouncer.log" ? slurp_file("$dir/pgbouncer.log") : '';
		if ($said =~ /FATAL/ || time() > $deadline)
		{
			$self->stop;
			croak "pgbouncer did not start:\n$said";
		}
		usleep(100_000);
	}
	note "pgbouncer ($self->{pool_mode} pooling, default_pool_size $self->{pool_size}) "
	  . "on $self->{host}:$self->{port} in front of " . $node->name;
	return $self;
}

sub host { return $_[0]->{host} }
sub port { return $_[0]->{port} }
sub pool_size { return $_[0]->{pool_size} }
sub logfile { return "$_[0]->{dir}/pgbouncer.log" }

# A libpq connection string that goes through the pooler.
sub connstr
{
	my ($self, $dbname, $user) = @_;
	$dbname //= 'postgres';
	$user //= $self->{user};
	return "host=$self->{host} port=$self->{port} dbname=$dbname user=$user";
}

# The node's psql, safe_psql and background_psql, connected through the pooler:
# psql takes the last -d it is given, so the pooler's connection string, added
# last, replaces the node's own.
sub _through
{
	my ($self, $dbname, %params) = @_;
	my $user = delete $params{user};
	$params{extra_params} =
	  [ @{ $params{extra_params} // [] }, '-d', $self->connstr($dbname, $user) ];
	return %params;
}

sub psql
{
	my ($self, $dbname, $sql, %params) = @_;
	return $self->{node}->psql($dbname, $sql, $self->_through($dbname, %params));
}

sub safe_psql
{
	my ($self, $dbname, $sql, %params) = @_;
	return $self->{node}->safe_psql($dbname, $sql, $self->_through($dbname, %params));
}

sub background_psql
{
	my ($self, $dbname, %params) = @_;
	return $self->{node}->background_psql($dbname, $self->_through($dbname, %params));
}

# Runs $sql through the pooler until it prints $expected ('t' by default); 1
# when it did, 0 after the TAP timeout.
sub poll_query_until
{
	my ($self, $dbname, $sql, $expected, %params) = @_;
	$expected //= 't';
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	my ($ret, $stdout, $stderr);
	while (time() < $deadline)
	{
		($ret, $stdout, $stderr) = $self->psql($dbname, $sql, %params);
		return 1 if $ret == 0 && $stdout eq $expected;
		usleep(50_000);
	}
	diag("poll_query_until through pgbouncer timed out: $sql\nlast: $stdout\n$stderr");
	return 0;
}

# A command on the admin console (SHOW POOLS, SHOW SERVERS, SHOW CLIENTS ...):
# its rows, each a hash by column name.
sub admin
{
	my ($self, $command) = @_;
	my ($ok, $stdout, $stderr) = $self->_admin($command);
	croak "pgbouncer admin console, $command: $stderr" unless $ok;
	my ($header, @lines) = split(/\n/, $stdout);
	my @columns = split(/\|/, $header // '', -1);
	my @rows;
	for my $line (@lines)
	{
		my %row;
		@row{@columns} = split(/\|/, $line, -1);
		push @rows, \%row;
	}
	return @rows;
}

sub _admin
{
	my ($self, $command) = @_;
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run(
		[ $self->{node}->installed_command('psql'), '-XA', '-P', 'footer=off', '-d',
		  $self->connstr('pgbouncer'), '-c', $command ],
		'>', \$stdout, '2>', \$stderr);
	return ($ok, $stdout, $stderr);
}

# The server connections of a database's pools (SHOW SERVERS rows).
sub servers
{
	my ($self, $dbname) = @_;
	return grep { $_->{database} eq $dbname } $self->admin('SHOW SERVERS');
}

# Waits until no client of the pooler is connected to $dbname; 1 when none is,
# 0 after the TAP timeout.
sub wait_for_no_clients
{
	my ($self, $dbname) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return 1 unless grep { $_->{database} eq $dbname } $self->admin('SHOW CLIENTS');
		usleep(50_000);
	}
	return 0;
}

# Stops PgBouncer (SIGTERM: immediate shutdown, which closes its server
# connections) and waits for it to exit; SIGKILL if it does not.
sub stop
{
	my ($self) = @_;
	my $h = $self->{harness} or return;
	delete $self->{harness};
	@running = grep { $_ != $self } @running;
	$h->kill_kill(grace => 10);    # SIGTERM, then SIGKILL after 10 s
	note "pgbouncer on port $self->{port} stopped";
	return;
}

END
{
	# a test that died half-way leaves no pooler behind
	local $?;
	$_->stop for @running;
}

1;
