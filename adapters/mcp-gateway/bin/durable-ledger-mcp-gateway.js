#!/usr/bin/env node
// The MCP gateway of durable_ledger: see README.md, or --help.
import { main } from '../src/main.js';

process.exit(await main(process.argv.slice(2)));
