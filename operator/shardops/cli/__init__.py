"""`kubectl campaign` (the kubectl plugin `kubectl-campaign`), one module per command. The modules,
lowest first:

    text.py               tables, durations, times and -o json|yaml documents every view shares [pure]
    campaign_summary.py   what status, plan and report show alike: shards, counts, budget     [pure]
    campaign_client.py    the reads and writes through the API client; errors into messages and
                          exit codes
    command.py            what every command is handed (flags, client, output, clock), shared reads
    campaign_actions.py   suspend, resume, retry, cancel: the recorded actions
    campaign_list.py      list: every campaign of a namespace at a glance
    campaign_results.py   results: every finished item's result in item order, as JSONL
    campaign_apply.py     apply: start a campaign from a local JSONL file uploaded to the S3 store
    campaign_events.py    events: one shard's life, history and Events merged by time
    campaign_plan.py      plan: the dry run of the scheduler's next pass
    campaign_purge.py     purge: delete a campaign and every result it stored
    campaign_report.py    report: the closing report and the closing checklist
    campaign_status.py    status [--watch]: where a campaign is right now
    campaign_completion.py  shell completion scripts and candidates for a parser (completion bash|zsh)
    campaign.py           the parser and the dispatch to the commands, --version, kubectl_complete-campaign
"""
