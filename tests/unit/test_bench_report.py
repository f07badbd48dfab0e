"""bench/local_report.py: the README section is what the recorded results render to."""

import json

from bench import local_report

OTHERS = "# Benchmarks\n\n## Planner\n\nplanner table\n"


def test_readme_section_is_the_recorded_results_rendered():
    results = json.loads(local_report.RESULTS.read_text())
    readme = local_report.README.read_text()
    assert local_report.SECTION in readme
    assert local_report.replace_section(readme, local_report.table(results)) == readme


def test_replace_section_keeps_the_other_sections():
    section = local_report.SECTION + "\n\nnew\n"
    appended = local_report.replace_section(OTHERS, section)
    assert appended == OTHERS + "\n" + section
    before = OTHERS + "\n" + local_report.SECTION + "\n\nold\n\n## Redis over TLS\n\nredis table\n"
    assert local_report.replace_section(before, section) == (
        OTHERS + "\n" + section + "\n## Redis over TLS\n\nredis table\n"
    )
