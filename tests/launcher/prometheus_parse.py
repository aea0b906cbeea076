#!/usr/bin/env python3
"""Parses Prometheus text exposition format with the prometheus_client library's own parser
and prints what it found, one line each, for the metrics endpoint's test:
  F <family name> <type>
  S <sample name> <label=value,... sorted, or -> <value>
Exit code 3 when prometheus_client is missing, 1 when the text does not parse."""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("python3-prometheus-client is not installed (apt-get install python3-prometheus-client)",
          file=sys.stderr)
    sys.exit(3)

text = open(sys.argv[1]).read()
try:
    for family in text_string_to_metric_families(text):
        print("F", family.name, family.type)
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) or "-"
            print("S", s.name, labels, repr(float(s.value)))
except Exception as e:  # the parser's own error: the text is not valid exposition format
    print(f"does not parse: {e}", file=sys.stderr)
    sys.exit(1)
