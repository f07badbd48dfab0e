from tests.store._fixtures import (aws_env, each_redis_server, redis_server, redis_store,  # noqa: F401
                                   redis_tls_server, s3_store, store)
