# DurableLedger::Shards: a sharded ledger for the TAP tests: N shard clusters,
# each with durable_ledger in its database "ledger", and a proxy cluster with
# durable_ledger_proxy in its database "proxy", whose PL/Proxy server
# durable_ledger_shards names the shards p0 .. pN-1 (modular mapping, a
# PUBLIC user mapping: PL/Proxy connects as the calling role, through the
# shards' Unix sockets, which TAP's clusters trust).  docs/scale-out.md sets
# up the same by hand.
#
#   my $ledger = DurableLedger::Shards->start('tag', 3, conf => ['max_connections = 60']);
#   $ledger->proxy                      # the proxy's PostgreSQL::Test::Cluster
#   $ledger->shard(1)                   # shard p1's
#   $ledger->shards                     # all of them, in order
#   $ledger->proxy_dsn(user => 'agent') # libpq DSN of the proxy database
#   $ledger->shard_dsn(1)               # of a shard's ledger database
#   $ledger->add_role('agent', 'durable_ledger_worker')   # on every cluster
#   $ledger->on_shards($sql)            # safe_psql on every shard
#   $ledger->another('2')               # a second ledger on the same clusters: databases
#                                       # ledger2 on the shards, proxy2 on the proxy
#   $ledger->stop
package DurableLedger::Shards;

use strict;
use warnings;
use Carp;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

sub start
{
	my ($class, $tag, $count, %opts) = @_;
	my @conf = @{ $opts{conf} // [] };
	my @shards;
	for my $i (0 .. $count - 1)
	{
		my $node = PostgreSQL::Test::Cluster->new("${tag}_p$i");
		$node->init;
		$node->append_conf('postgresql.conf', join("\n", @conf, @{ $opts{shard_conf} // [] }) . "\n");
		$node->start;
		push @shards, $node;
	}
	my $proxy = PostgreSQL::Test::Cluster->new("${tag}_proxy");
	$proxy->init;
	$proxy->append_conf('postgresql.conf', join("\n", @conf) . "\n");
	$proxy->start;
	my $self = bless { proxy => $proxy, shards => \@shards, suffix => '' }, $class;
	$self->create;
	return $self;
}

sub another
{
	my ($self, $suffix) = @_;
	my $other = bless { %$self, suffix => $suffix }, ref($self);
	$other->create;
	return $other;
}

# The ledger databases on the shards, the proxy database and its server.
sub create
{
	my ($self) = @_;
	my ($ledger, $proxydb) = map { $_ . $self->{suffix} } qw(ledger proxy);
	for my $node (@{ $self->{shards} })
	{
		$node->safe_psql('postgres', "CREATE DATABASE $ledger");
		$node->safe_psql($ledger, 'CREATE EXTENSION durable_ledger');
	}
	my $proxy = $self->{proxy};
	$proxy->safe_psql('postgres', "CREATE DATABASE $proxydb");
	my $partitions = join(",\n", map {
		"p$_ " . quote_literal($self->shard_dsn($_)) } 0 .. $#{ $self->{shards} });
	$proxy->safe_psql($proxydb, qq{
		CREATE EXTENSION durable_ledger_proxy CASCADE;
		CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy
		    OPTIONS (modular_mapping '1', $partitions);
		CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards;
		GRANT USAGE ON FOREIGN SERVER durable_ledger_shards
		    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin,
		       durable_ledger_approver;});
}

sub quote_literal
{
	my ($text) = @_;
	$text =~ s/'/''/g;
	return "'$text'";
}

sub proxy { return $_[0]{proxy}; }
sub shard { return $_[0]{shards}[ $_[1] ]; }
sub shards { return @{ $_[0]{shards} }; }

# a libpq DSN (key=value) of the proxy database, as the test's user or another
sub proxy_dsn
{
	my ($self, %opts) = @_;
	my $dsn = $self->{proxy}->connstr('proxy' . $self->{suffix});
	$dsn .= " user=$opts{user}" if $opts{user};
	return $dsn;
}

sub shard_dsn
{
	my ($self, $i, %opts) = @_;
	my $node = $self->{shards}[$i];
	my $dsn = 'host=' . $node->host . ' port=' . $node->port . ' dbname=ledger' . $self->{suffix};
	$dsn .= " user=$opts{user}" if $opts{user};
	return $dsn;
}

# A login role on every cluster (roles are per cluster), member of the groups.
sub add_role
{
	my ($self, $name, @groups) = @_;
	my $grants = join('', map { "GRANT $_ TO $name;" } @groups);
	for my $node ($self->{proxy}, @{ $self->{shards} })
	{
		$node->safe_psql('postgres', "CREATE ROLE $name LOGIN; $grants");
	}
}

sub on_shards
{
	my ($self, $sql) = @_;
	return map { $_->safe_psql('ledger' . $self->{suffix}, $sql) } @{ $self->{shards} };
}

sub stop
{
	my ($self) = @_;
	$_->stop for $self->{proxy}, @{ $self->{shards} };
}

1;
