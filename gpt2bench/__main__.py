from gpt2bench.cli import main

raise SystemExit(main())
