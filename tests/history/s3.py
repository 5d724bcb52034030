#!/usr/bin/env python3
"""A test's view of an S3-compatible server (moto's), with boto3:

    s3.py make-bucket --endpoint URL --bucket NAME
    s3.py list --endpoint URL --bucket NAME [--prefix P]
    s3.py put --endpoint URL --bucket NAME --key KEY --text TEXT
    s3.py duckdb --endpoint URL --bucket NAME --prefix P

`list` prints a JSON object: each key under the prefix with its size, the SHA-256 of its bytes (read back with
GET) and its last-modified time, so a test compares the objects with local files without trusting the listing.
`duckdb` downloads the objects under the prefix, keys as paths, and reads them with DuckDB as one table with
Hive partitions (`<prefix>/*/*.parquet`, as a warehouse reads the bucket; DuckDB's own S3 reader is an extension
it downloads, which these machines cannot): the job count, distinct job ids, days, and jobs by collector (the
object's name). Credentials are moto's test ones from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

import boto3
from botocore.config import Config


def client(endpoint):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["make-bucket", "list", "put", "duckdb"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default="")
    p.add_argument("--key")
    p.add_argument("--text")
    a = p.parse_args()
    s3 = client(a.endpoint)
    if a.command == "make-bucket":
        s3.create_bucket(Bucket=a.bucket)
        print("{}")
    elif a.command == "put":
        s3.put_object(Bucket=a.bucket, Key=a.key, Body=a.text.encode())
        print("{}")
    elif a.command == "duckdb":
        import duckdb

        with tempfile.TemporaryDirectory() as d:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=a.bucket, Prefix=a.prefix):
                for o in page.get("Contents", []):
                    path = os.path.join(d, o["Key"])
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    s3.download_file(a.bucket, o["Key"], path)
            src = "read_parquet('%s/*/*.parquet', hive_partitioning = true, filename = true)" % os.path.join(
                d, a.prefix.rstrip("/")
            )
            jobs, ids, days = duckdb.sql(
                f"SELECT count(*), count(DISTINCT job_id), count(DISTINCT end_date) FROM {src}"
            ).fetchall()[0]
            rows = duckdb.sql(
                f"SELECT regexp_extract(filename, '([^/]+)[.]parquet$', 1) AS c, count(*) FROM {src} GROUP BY c"
            ).fetchall()
            json.dump(
                {"jobs": jobs, "distinct_job_ids": ids, "days": days, "by_collector": {c: n for c, n in rows}},
                sys.stdout,
                sort_keys=True,
            )
    else:
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=a.bucket, Prefix=a.prefix):
            for o in page.get("Contents", []):
                body = s3.get_object(Bucket=a.bucket, Key=o["Key"])["Body"].read()
                out[o["Key"]] = {
                    "size": len(body),
                    "sha256": hashlib.sha256(body).hexdigest(),
                    "modified": o["LastModified"].isoformat(),
                }
        json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
