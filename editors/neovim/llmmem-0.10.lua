-- llmmem's language server for Neovim 0.10 (`vim.lsp.start` in a FileType autocommand).
-- On Neovim 0.11+ prefer lsp/llmmem.lua beside this file.
--
-- Use it from init.lua:
--   dofile("/path/to/llmmem-0.10.lua")
-- or paste it there. To change settings, edit the `llmmem` table below.
--
-- `llmmem-lsp` comes with `pip install llmmem`; when it is not on PATH, use the Python that has
-- llmmem: cmd = { "/path/to/venv/bin/python", "-m", "llmmem_lsp" }.

if vim.fn.has("nvim-0.10") ~= 1 then
  vim.notify(
    "llmmem: llmmem-0.10.lua needs Neovim 0.10 or newer (vim.lsp.start, vim.fs.root); nothing was set up",
    vim.log.levels.WARN
  )
  return
end

-- The server's settings (the same keys as VS Code's `llmmem.*`).
local llmmem = {
  -- gpu = "A100-80GB",   -- GPU for files that name none; unset: a pragma, pyproject.toml, this machine's
  -- worldSize = 8,       -- GPUs per job where no launcher or config says
  hub = true, -- look unknown models up on the Hugging Face Hub (in the background)
  hubTimeoutSeconds = 3,
  -- severity = { LLM002 = "info", LLM005 = "off" },  -- per rule: error, warning, info or off
  debounceMs = 300, -- quiet time after an edit before analysing
  detectGpu = true, -- with no GPU set anywhere, use this machine's
}

local root_markers = { "pyproject.toml", "setup.py", "setup.cfg", ".git" }

vim.api.nvim_create_autocmd("FileType", {
  group = vim.api.nvim_create_augroup("llmmem", { clear = true }),
  pattern = { "python", "yaml", "json", "sh" },
  desc = "Start or attach llmmem's language server",
  callback = function(args)
    if vim.bo[args.buf].buftype ~= "" then
      return
    end
    vim.lsp.start({
      name = "llmmem",
      cmd = { "llmmem-lsp" },
      root_dir = vim.fs.root(args.buf, root_markers) or vim.fn.getcwd(),
      init_options = llmmem,
      settings = { llmmem = llmmem },
    }, { bufnr = args.buf })
  end,
})
