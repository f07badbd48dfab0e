"""The Redis reducer (context `redis_reducer: true`): an ElastiCache (Valkey) gradient exchange.

Created only when the option is on; the default stack has no VPC at all.

- VPC: isolated subnets in 2 AZs (no internet gateway, no NAT gateway), a flow log to CloudWatch
  Logs, gateway endpoints (free) for S3 and DynamoDB: what the functions in the VPC call.
  No interface endpoints: the functions placed in the VPC (train_step at every tier, aggregate)
  call S3 and DynamoDB only, and the planner, which calls Step Functions (Chain), stays outside
  the VPC because it never opens the exchange (`Settings.exchange_store()` users: smlt/runtime/train/
  smlt/runtime/steps/train.py, smlt/runtime/steps/aggregate.py). X-Ray: the handlers do not use the X-Ray SDK, the Lambda
  service writes the traces of active tracing itself, so no X-Ray endpoint is needed either.
  tests/infra/test_redis.py checks the first claim against the handlers' imports.
- ElastiCache: a Valkey replication group, cluster mode disabled (RedisStore is a plain
  redis-py client using SCAN and database 0), one node of `redis_node_type`, TLS in transit
  (mode required) and encryption at rest, on a non-default port, in the isolated subnets.
- Security groups: the functions' group may reach the cache on its port and HTTPS (only the
  gateway endpoints are routable); the cache's group admits only the functions' group on the
  cache port and has no egress.
- `url`: `rediss://<primary endpoint>:<port>/0`, the functions' `SMLT_EXCHANGE_URL`.

A Lambda function in a VPC needs ENI permissions on its execution role; `grant_vpc_access`
adds them scoped to this VPC's subnets and security group (no managed policy).
"""

from __future__ import annotations

from aws_cdk import Fn, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.stacks.nag import acknowledge

ENGINE = "valkey"
ENGINE_VERSION = "8.0"
# Not 6379 (cdk-nag AwsSolutions-AEC5: port obfuscation); the URL carries the port.
REDIS_PORT = 6380
HTTPS = 443
MAX_AZS = 2
SUBNET_GROUP_NAME = "Exchange"


class RedisExchange(Construct):
    def __init__(self, scope: Construct, id: str, *, node_type: str, log_retention: logs.RetentionDays) -> None:
        super().__init__(scope, id)

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.42.0.0/16"),
            max_azs=MAX_AZS,
            nat_gateways=0,
            create_internet_gateway=False,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name=SUBNET_GROUP_NAME, subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=20
                )
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
        )
        self.subnets = ec2.SubnetSelection(subnet_group_name=SUBNET_GROUP_NAME)
        self.flow_log_group = logs.LogGroup(
            self, "FlowLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

        self.function_sg = ec2.SecurityGroup(
            self,
            "FunctionsSecurityGroup",
            vpc=self.vpc,
            description="smlt functions in the VPC: to the exchange (Redis port) and the S3/DynamoDB gateway endpoints",
            allow_all_outbound=False,
        )
        self.cache_sg = ec2.SecurityGroup(
            self,
            "CacheSecurityGroup",
            vpc=self.vpc,
            description="smlt exchange (ElastiCache): only the smlt functions security group, on the cache port",
            allow_all_outbound=False,
        )
        self.cache_sg.add_ingress_rule(self.function_sg, ec2.Port.tcp(REDIS_PORT), "smlt functions to the exchange")
        self.function_sg.add_egress_rule(self.cache_sg, ec2.Port.tcp(REDIS_PORT), "to the exchange")
        # Isolated subnets route only inside the VPC and to the gateway endpoints (S3, DynamoDB).
        self.function_sg.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(HTTPS), "HTTPS: only the S3 and DynamoDB gateway endpoints are routable"
        )

        self.subnet_group = elasticache.CfnSubnetGroup(
            self,
            "SubnetGroup",
            description="smlt exchange: the VPC's isolated subnets",
            subnet_ids=self.vpc.select_subnets(subnet_group_name=SUBNET_GROUP_NAME).subnet_ids,
        )
        self.cache = elasticache.CfnReplicationGroup(
            self,
            "Cache",
            replication_group_description="smlt per-step gradient exchange (transient: deleted after each round)",
            engine=ENGINE,
            engine_version=ENGINE_VERSION,
            cache_node_type=node_type,
            num_cache_clusters=1,
            automatic_failover_enabled=False,
            multi_az_enabled=False,
            port=REDIS_PORT,
            transit_encryption_enabled=True,
            transit_encryption_mode="required",
            at_rest_encryption_enabled=True,
            cache_subnet_group_name=self.subnet_group.ref,
            security_group_ids=[self.cache_sg.security_group_id],
            auto_minor_version_upgrade=True,
            snapshot_retention_limit=0,
        )
        # Nothing durable lives here: each round's exchange objects are deleted after the round.
        self.cache.apply_removal_policy(RemovalPolicy.DESTROY)
        for rule in ("AwsSolutions-AEC4", "AwsSolutions-AEC6"):
            acknowledge(self.cache, rule)

        self.endpoint_address = self.cache.attr_primary_end_point_address
        self.endpoint_port = self.cache.attr_primary_end_point_port
        self.url = Fn.join("", ["rediss://", self.endpoint_address, ":", self.endpoint_port, "/0"])

    def grant_vpc_access(self, role: iam.IRole) -> None:
        """What Lambda needs on the execution role to create, use and remove the function's ENIs
        in this VPC (the actions of AWSLambdaVPCAccessExecutionRole minus its logs:* on `*`).

        Describe* take no resource scoping. CreateNetworkInterface is scoped to the VPC's subnets,
        the functions' security group and network interfaces of this account and region; the
        other ENI actions to network interfaces of this account and region (interface ids are
        made at run time; Lambda's documentation asks for all of them on DeleteNetworkInterface).
        """
        stack = Stack.of(self)
        enis = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        subnets = [
            stack.format_arn(service="ec2", resource="subnet", resource_name=s.subnet_id)
            for s in self.vpc.select_subnets(subnet_group_name=SUBNET_GROUP_NAME).subnets
        ]
        sg = stack.format_arn(
            service="ec2", resource="security-group", resource_name=self.function_sg.security_group_id
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"], resources=["*"])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["ec2:CreateNetworkInterface"], resources=[enis, *subnets, sg])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                ],
                resources=[enis],
            )
        )
